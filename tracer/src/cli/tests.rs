//! Every command line clap or `validate` refuses, with what it says.
use clap::Parser as _;

use super::*;

/// What a command line gives: Ok, a clap error (exit 2), or a
/// validation error (exit 2) containing the expected words.
fn check(args: &[&str]) -> Result<(), String> {
    let cli = Cli::try_parse_from(std::iter::once("memtrace-bpf").chain(args.iter().copied()))
        .map_err(|e| format!("clap: {e}"))?;
    cli.validate()
}

#[test]
fn no_number_can_panic_or_overflow() {
    for table in [
        DURATIONS,
        COUNTS_AND_SIZES,
        TARGETS_AND_OUTPUTS,
        INTERVALS_SNAPSHOTS_AND_SERVE,
    ] {
        assert_each_gives_what_it_expects(table);
    }
}

/// Checks each command line of `table` against what it expects.
fn assert_each_gives_what_it_expects(table: Cases) {
    for (args, expected) in table {
        let got = check(args);
        match (expected, &got) {
            (None, Ok(())) => {}
            (Some(words), Err(msg)) if msg.contains(words) => {}
            _ => panic!("{args:?}: expected {expected:?}, got {got:?}"),
        }
    }
}

/// Command lines and what each gives: (arguments, expected: None =
/// accepted, Some(words) = refused).
type Cases = &'static [(&'static [&'static str], Option<&'static str>)];

/// -d and --min-age: durations in seconds.
const DURATIONS: Cases = &[
    (&["-d", "1e20"], Some("up to 31536000")),
    (&["-d", "31536001"], Some("a year")),
    (&["-d", "31536000"], None),
    (&["-d", "1e-9"], None),
    (&["-d", "0"], Some("positive")),
    (&["-d", "-1"], Some("clap")),
    (&["-d=-1"], Some("positive")),
    (&["-d", "NaN"], Some("positive")),
    (&["-d", "inf"], Some("positive")),
    (&["-d", "-inf"], Some("clap")),
    (&["-d", "1e400"], Some("positive")),
    (&["-d", ""], Some("clap")),
    (&["--min-age", "-1"], Some("from 0 to 31536000")),
    (&["--min-age=-1"], Some("from 0 to 31536000")),
    (&["--min-age", "NaN"], Some("from 0 to")),
    (&["--min-age", "inf"], Some("from 0 to")),
    (&["--min-age", "1e9"], Some("a year")),
    (&["--min-age", "x"], Some("clap")),
    (&["--min-age", "0"], None),
    (&["--min-age", "2.5"], None),
];

/// --top, --sample-rate and the sizes of maps and buffers.
const COUNTS_AND_SIZES: Cases = &[
    (&["--top", "0"], Some("at least 1")),
    (&["--top", "-1"], Some("clap")),
    (&["--top", "99999999999999999999999"], Some("clap")),
    (&["--sample-rate", "0"], Some("from 1")),
    (
        &["--sample-rate", "18446744073709551615"],
        Some("1099511627776"),
    ),
    (&["--sample-rate", "1099511627776"], None),
    (&["--sample-rate", "18446744073709551616"], Some("clap")),
    (
        &["--max-live", "4294967295"],
        Some("--max-live must be from 1 to 67108864"),
    ),
    (&["--max-live", "0"], Some("--max-live")),
    (&["--max-live", "67108864"], None),
    (
        &["--stack-storage-size", "4294967295"],
        Some("--stack-storage-size must be from 1 to 262144"),
    ),
    (&["--stack-storage-size", "0"], Some("--stack-storage-size")),
    (&["--ringbuf-mb", "4096"], Some("power of two")),
    (&["--ringbuf-mb", "0"], Some("power of two")),
    (&["--ringbuf-mb", "1024"], None),
    (&["--ringbuf-mb", "4294967295"], Some("power of two")),
    (&["--stack-bytes", "0"], Some("multiple of 4096")),
    (&["--stack-bytes", "4294967295"], Some("multiple of 4096")),
];

/// What is traced and where the report goes.
const TARGETS_AND_OUTPUTS: Cases = &[
    (&["--pid", "-1"], Some("clap")),
    (&["--pid", "4294967296"], Some("clap")),
    (&["--pid", ""], Some("clap")),
    (&["--comm", ""], Some("1 to 15 bytes")),
    (&["--allocator", ""], Some("not an empty string")),
    (&["-o", ""], Some("clap")),
];

/// --interval, --sort, --snapshot-on-peak and --serve.
const INTERVALS_SNAPSHOTS_AND_SERVE: Cases = &[
    (&["--interval", "1"], None),
    (&["--interval", "1", "-o", "heap.json"], None),
    (&["--sort", "growth"], Some("add --interval SECS")),
    (&["--sort", "growth", "--interval", "1"], None),
    (&["--sort", "inuse"], None),
    (&["--interval", "1", "-o", "heap-{n}.json"], None),
    (&["--interval", "0.01", "-o", "h{n}"], Some("from 0.1")),
    (&["--interval", "NaN", "-o", "h{n}"], Some("from 0.1")),
    (&["--interval", "1e300", "-o", "h{n}"], Some("from 0.1")),
    (&["-o", "heap-{n}.json"], Some("add --interval")),
    (&["--snapshot-on-peak", "-o", "heap-{n}.json"], None),
    (&["--snapshot-on-peak=25%", "-o", "heap-{n}.json"], None),
    (
        &["--snapshot-on-peak=0.5", "--interval", "1", "-o", "h{n}"],
        None,
    ),
    (&["--snapshot-on-peak"], Some("give -o a path with {n}")),
    (
        &["--snapshot-on-peak", "-o", "heap.json"],
        Some("give -o a path with {n}"),
    ),
    (&["--snapshot-on-peak=0", "-o", "h{n}"], Some("above 0")),
    (&["--snapshot-on-peak=-1", "-o", "h{n}"], Some("above 0")),
    (&["--snapshot-on-peak=NaN", "-o", "h{n}"], Some("above 0")),
    (&["--snapshot-on-peak=x%", "-o", "h{n}"], Some("above 0")),
    (&["--serve", ":6060"], None),
    (&["--serve", "6060"], Some("HOST:PORT")),
    (&["--serve", ":99999"], Some("HOST:PORT")),
];

#[test]
fn command_only_flags_are_refused_without_a_command() {
    for flag in ["--exit-status", "--keep-running"] {
        for target in [&["--pid", "1"][..], &["--binary", "/bin/ls"][..], &[][..]] {
            let mut args = target.to_vec();
            args.push(flag);
            let err = check(&args).expect_err("refused");
            // clap refuses the bare flag itself; validate the rest.
            assert!(err.contains(flag) && err.contains("CMD"), "{args:?}: {err}");
        }
        assert_eq!(check(&[flag, "--", "/bin/true"]), Ok(()), "{flag}");
    }
}

/// The README's synopsis: the first code block without a language tag
/// after `## Usage`.
fn readme_synopsis() -> &'static str {
    let readme = include_str!("../../../README.md");
    let usage = readme
        .split_once("\n## Usage\n")
        .expect("README has a `## Usage` section")
        .1;
    // Fenced blocks alternate with prose: odd pieces are blocks, each
    // starting with its language tag line.
    usage
        .split("```")
        .skip(1)
        .step_by(2)
        .find_map(|block| block.strip_prefix('\n'))
        .expect("a synopsis block without a language tag")
}

/// Every visible option of `cmd`: its long form, and its short one if any.
fn visible_options(cmd: &clap::Command) -> Vec<(String, Option<String>)> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let long = format!("--{}", a.get_long()?);
            Some((long, a.get_short().map(|c| format!("-{c}"))))
        })
        .collect()
}

/// Whether `flag` appears in `text` as a whole word (`--top` is not found
/// inside `--top-n`).
fn lists(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + flag.len()..].chars().next();
        !before.is_some_and(|c| c == '-' || c.is_alphanumeric())
            && !after.is_some_and(|c| c == '-' || c.is_alphanumeric())
    })
}

#[test]
fn the_readme_synopsis_lists_every_option() {
    use clap::CommandFactory as _;
    let synopsis = readme_synopsis();
    let saved = crate::saved::SavedCli::command();
    let mut missing = Vec::new();
    for option in visible_options(&Cli::command()) {
        if !lists(synopsis, &option.0) {
            missing.push(option.0);
        }
    }
    // Each subcommand has its own line, where a short form will do.
    for sub in saved.get_subcommands() {
        let prefix = format!("memtrace-bpf {} ", sub.get_name());
        let Some(line) = synopsis.lines().find(|l| l.starts_with(&prefix)) else {
            missing.push(prefix);
            continue;
        };
        for (long, short) in visible_options(sub) {
            if !lists(line, &long) && !short.as_ref().is_some_and(|s| lists(line, s)) {
                missing.push(format!("{prefix}{long}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's Usage synopsis does not list: {missing:?}; add them there \
         (and to docs/usage.md)"
    );
}

#[test]
fn the_readme_stays_a_users_document_without_stale_claims() {
    let readme = include_str!("../../../README.md");
    // A README that grew into a development log; measurements and
    // design notes belong in docs/.
    assert!(
        readme.len() < 40_000,
        "README.md is {} bytes: move measurements and design notes to docs/",
        readme.len()
    );
    let docs = [
        ("README.md", readme),
        ("docs/usage.md", include_str!("../../../docs/usage.md")),
        ("docs/formats.md", include_str!("../../../docs/formats.md")),
        ("docs/design.md", include_str!("../../../docs/design.md")),
    ];
    // Each was untrue: every snapshot file has its full frame table, and not
    // every event that goes unrecorded is a counted loss of data.
    let stale = [
        "names only the frames new since the last one",
        "Nothing is dropped silently",
        "nothing is dropped silently",
    ];
    for (name, text) in docs {
        for phrase in stale {
            assert!(!text.contains(phrase), "{name} still says {phrase:?}");
        }
    }
}

#[test]
fn help_shows_the_snapshot_number_placeholder_literally() {
    // clap turns `{n}` in help text into a line break.
    use clap::CommandFactory as _;
    let long = Cli::command().render_long_help().to_string();
    assert!(long.contains("-o heap-{n}.json"), "{long}");
    assert!(long.contains("-o containing `{n}`"), "{long}");
    let short = Cli::command().render_help().to_string();
    assert!(short.contains("-o heap-{n}.json"), "{short}");
}
