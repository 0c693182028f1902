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
    // (arguments, expected: None = accepted, Some(words) = refused).
    let table: &[(&[&str], Option<&str>)] = &[
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
        (&["--pid", "-1"], Some("clap")),
        (&["--pid", "4294967296"], Some("clap")),
        (&["--pid", ""], Some("clap")),
        (&["--comm", ""], Some("1 to 15 bytes")),
        (&["--allocator", ""], Some("not an empty string")),
        (&["-o", ""], Some("clap")),
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
        (&["--serve", ":6060"], None),
        (&["--serve", "6060"], Some("HOST:PORT")),
        (&["--serve", ":99999"], Some("HOST:PORT")),
    ];
    for (args, expected) in table {
        let got = check(args);
        match (expected, &got) {
            (None, Ok(())) => {}
            (Some(words), Err(msg)) if msg.contains(words) => {}
            _ => panic!("{args:?}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn help_shows_the_snapshot_number_placeholder_literally() {
    // clap turns `{n}` in help text into a line break (issue #19, 17).
    use clap::CommandFactory as _;
    let long = Cli::command().render_long_help().to_string();
    assert!(long.contains("-o heap-{n}.json"), "{long}");
    assert!(long.contains("-o containing `{n}`"), "{long}");
    let short = Cli::command().render_help().to_string();
    assert!(short.contains("-o heap-{n}.json"), "{short}");
}
