//! The whole command line as a user meets it: the trace's options (`cli`)
//! with the saved-profile subcommands `report` and `diff` (`saved`), which
//! main.rs dispatches before clap parses the trace's own options. Only the
//! man pages and shell completions (tracer/examples/dist_assets.rs, run by
//! `cargo xtask dist`) need it in one piece; nothing parses with it.

use clap::CommandFactory as _;

/// `memtrace-bpf` with its options and the `report` and `diff` subcommands.
pub fn command() -> clap::Command {
    let saved = crate::saved::SavedCli::command();
    // main.rs knows no `help` subcommand (`--help` is the way).
    let mut command = crate::cli::Cli::command().disable_help_subcommand(true);
    for sub in saved.get_subcommands() {
        command = command.subcommand(sub.clone());
    }
    command
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_whole_command_line_is_a_valid_clap_command() {
        // debug_assert checks clap's own rules (ids, positionals, subcommands).
        let command = super::command();
        command.clone().debug_assert();
        let subs: Vec<&str> = command.get_subcommands().map(|s| s.get_name()).collect();
        assert_eq!(subs, ["report", "diff"]);
        assert!(command.get_arguments().any(|a| a.get_id() == "serve"));
    }
}
