//! Saved files of each format version, as traces wrote them, read as
//! `memtrace-bpf report FILE` reads them: each renders the text report and
//! the JSON kept in tracer/tests/golden/saved/. `v2-first.json` is version
//! 2 as first written (without the fields added since), `v1.json` the same
//! profile with each stack's frames in place: both render the same, and
//! what is read is written back and read again unchanged. Other versions
//! are refused with theirs, and a list of frames is one form or the other.
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

#[test]
fn json_of_another_version_is_refused_with_the_version() {
    let text = String::from_utf8(super::json_of(&super::profile(1, 10))).expect("utf-8");
    let other = text.replace("memtrace-bpf/2", "memtrace-bpf/9");
    let err = super::err_of(super::json(other.as_bytes()));
    assert!(
        err.contains("memtrace-bpf/9") && err.contains("memtrace-bpf/2"),
        "{err}"
    );
    // A field of another shape still names the version first.
    let odd = other.replace("\"stacks\": [", "\"stacks\": 3, \"x\": [");
    let err = super::err_of(super::json(odd.as_bytes()));
    assert!(err.contains("memtrace-bpf/9"), "{err}");
    let err = super::err_of(super::json(b"{\"format\": \"memtrace-bpf-diff/1\"}"));
    assert!(err.contains("it is a diff"), "{err}");
    let err = super::err_of(super::json(b"{\"stacks\": []}"));
    assert!(err.contains("no \"format\""), "{err}");
}

#[test]
fn a_list_of_frames_is_indices_or_frames_not_both() {
    let v1 = fs::read_to_string(dir().join("v1.json")).expect("v1.json");
    let mixed = v1.replacen("\"frames\": [\n", "\"frames\": [\n        0,\n", 1);
    assert_ne!(mixed, v1, "v1.json changed");
    let err = super::err_of(super::json(mixed.as_bytes()));
    assert!(err.contains("mixes indices and frames"), "{err}");
    let v2 = fs::read_to_string(dir().join("v2.json")).expect("v2.json");
    let far = v2.replacen("\"frames\":[0,", "\"frames\":[4294967296,", 1);
    assert_ne!(far, v2, "v2.json changed");
    let err = super::err_of(super::json(far.as_bytes()));
    assert!(
        err.contains("frame index 4294967296 is out of range"),
        "{err}"
    );
}
