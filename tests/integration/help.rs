//! `--help` as a user sees it: the real binary's output, piped.

use std::process::Command;

use crate::harness::TRACER;

#[test]
fn help_shows_the_snapshot_number_placeholder_literally() {
    for flag in ["--help", "-h"] {
        let out = Command::new(TRACER).arg(flag).output().expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {out:?}");
        // clap reads `{n}` as a line break unless it is written specially.
        assert!(text.contains("-o heap-{n}.json"), "{flag}: {text}");
        assert!(text.contains("-o containing `{n}`"), "{flag}: {text}");
        assert!(!text.contains('\u{1b}'), "{flag}: colour on a pipe: {text}");
    }
}
