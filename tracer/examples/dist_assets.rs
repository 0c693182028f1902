//! Writes the man pages and shell completions of `memtrace-bpf` into DIR,
//! generated from the clap definition itself (`command_line::command`), so
//! they cannot drift from `--help`. Run by `cargo xtask dist`:
//!
//!     cargo run --release -p memtrace-bpf --example dist_assets -- DIR
//!
//! DIR gets `memtrace-bpf.1`, `memtrace-bpf-report.1`, `memtrace-bpf-diff.1`
//! and `completions/{memtrace-bpf.bash,_memtrace-bpf,memtrace-bpf.fish}`.
//! An example rather than a hidden subcommand: clap_mangen and
//! clap_complete are dev-dependencies and stay out of the shipped binary.

use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap_complete::Shell;

const BIN: &str = "memtrace-bpf";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        println!("usage: dist_assets DIR (writes man pages and completions into DIR)");
        return ExitCode::from(2);
    };
    match write_all(Path::new(&dir)) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("dist_assets: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let command = memtrace_bpf::command_line::command();
    fs::create_dir_all(dir)?;
    // One page per command, named by its display name (memtrace-bpf-report).
    clap_mangen::generate_to(command.clone(), dir)?;
    let mut written: Vec<PathBuf> = std::iter::once(BIN.to_owned())
        .chain(
            command
                .get_subcommands()
                .map(|s| format!("{BIN}-{}", s.get_name())),
        )
        .map(|name| dir.join(format!("{name}.1")))
        .collect();
    if let Some(missing) = written.iter().find(|p| !p.is_file()) {
        return Err(std::io::Error::other(format!(
            "clap_mangen wrote no {}",
            missing.display()
        )));
    }
    let completions = dir.join("completions");
    fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut command.clone(), BIN, &completions)?;
        if shell == Shell::Bash {
            mend_bash_subcommands(&path)?;
        }
        written.push(path);
    }
    Ok(written)
}

/// clap_complete 4.6's bash script reaches `memtrace__bpf__subcmd__report`
/// for `memtrace-bpf report ...` but labels that case
/// `memtrace__subcmd__bpf__subcmd__report` (the program's hyphen escaped as
/// a subcommand separator: clap-rs/clap#6421), so nothing completed after
/// `report` or `diff`. The labels are spelled as the loop spells them.
fn mend_bash_subcommands(path: &Path) -> std::io::Result<()> {
    let script = fs::read_to_string(path)?;
    let wrong = format!("        {}__subcmd__", BIN.replace('-', "__subcmd__"));
    let right = format!("        {}__subcmd__", BIN.replace('-', "__"));
    let mended = script.replace(&wrong, &right);
    if mended.contains(&format!("{}__subcmd__", BIN.replace('-', "__subcmd__"))) {
        return Err(std::io::Error::other(format!(
            "{}: a subcommand label still spelled as clap-rs/clap#6421 spells it",
            path.display()
        )));
    }
    fs::write(path, mended)
}
