//! Saved files of each format version, as traces wrote them, read as
//! `memtrace-bpf report FILE` reads them: each renders the text report and
//! the JSON kept in tracer/tests/golden/saved/. `v2-first.json` is version
//! 2 as first written (without the fields added since), `v1.json` the same
//! profile with each stack's frames in place: both render the same, and
//! what is read is written back and read again unchanged.
//! `MEMTRACE_BLESS=1 cargo test -p memtrace-bpf --lib saved::` rewrites the
//! expected outputs (never the inputs); then read the diff.

use std::{fs, path::PathBuf};

use crate::report::{self, Format, RenderOptions, View};
use crate::saved::{load, sort_stacks};

const BLESS_VAR: &str = "MEMTRACE_BLESS";

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/saved")
}

/// What `memtrace-bpf report FILE --format FORMAT` writes.
fn report_of(file: &str, format: Format) -> Vec<u8> {
    let path = dir().join(file);
    let mut p = load(&path).unwrap_or_else(|e| panic!("{file}: {e:#}"));
    let sort = sort_stacks(&mut p, None, &path).expect("sort");
    let options = RenderOptions {
        format,
        view: View::InuseSpace,
        top: 10,
        sort,
    };
    let mut out = Vec::new();
    report::render(&p, &options, &mut out).expect("render");
    out
}

/// Compares `actual` with the expected output `name`, or rewrites it when
/// blessing.
fn check(name: &str, actual: &[u8]) {
    let path = dir().join(name);
    if std::env::var(BLESS_VAR).as_deref() == Ok("1") {
        fs::write(&path, actual).expect("write expected output");
        return;
    }
    let expected = fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}\ncreate it with: {BLESS_VAR}=1 cargo test -p memtrace-bpf \
             --lib saved::",
            path.display()
        )
    });
    assert!(
        expected == actual,
        "{} differs\n--- expected\n{}\n--- actual\n{}\nif the change is intended, bless it \
         with: {BLESS_VAR}=1 cargo test -p memtrace-bpf --lib saved::",
        path.display(),
        String::from_utf8_lossy(&expected),
        String::from_utf8_lossy(actual),
    );
}

#[test]
fn each_format_version_renders_as_before() {
    for version in ["v2", "v2-history", "v2-first"] {
        check(
            &format!("{version}.report.txt"),
            &report_of(&format!("{version}.json"), Format::Text),
        );
        check(
            &format!("{version}.report.json"),
            &report_of(&format!("{version}.json"), Format::Json),
        );
    }
}

#[test]
fn version_1_renders_as_the_same_profile_in_version_2() {
    check("v2-first.report.txt", &report_of("v1.json", Format::Text));
    check("v2-first.report.json", &report_of("v1.json", Format::Json));
}

#[test]
fn what_is_written_reads_back_whole() {
    // Between them the two set every field a trace writes.
    for file in ["v2.json", "v2-history.json"] {
        let p = load(&dir().join(file)).expect("reads");
        let mut written = Vec::new();
        report::write_json(&p, &mut written).expect("json");
        let back = super::json(&written).expect("reads back");
        assert_eq!(back, p, "{file}");
    }
}
