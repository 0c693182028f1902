//! A plugin unloaded and another loaded at the same address
//! (tests/targets/dl_reuse.c: dlopen A, allocate, dlclose A, dlopen B,
//! allocate), in exact mode, by pid and as a started command, with the
//! kernel's walker and with `--unwind dwarf`: no block is ever named from
//! the other library. Where the tracer read the maps while A was mapped
//! (attached once A was loaded), each block is named from its own
//! library. Where A came and went before the tracer could read the maps,
//! A's block is named from A if the tracer caught up in time, else its
//! frames in A's range stay unnamed and a note says why.

use std::path::PathBuf;

use serde_json::Value;

use crate::harness::{
    compile_c, function_names as names, scratch,
    sites::{per_site, O2_FLAGS},
    JsonTracer, Target,
};

/// (program, library A, library B), built without frame pointers. The
/// libraries are the test's own: another test's build renamed over a
/// loaded one would show in the maps as deleted.
fn build(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let lib = [O2_FLAGS, &["-shared", "-fPIC"]].concat();
    let a = compile_c(
        "dl_reuse",
        &format!("{tag}-a"),
        &[&lib[..], &["-DLIB_A"]].concat(),
    );
    let b = compile_c(
        "dl_reuse",
        &format!("{tag}-b"),
        &[&lib[..], &["-DLIB_B"]].concat(),
    );
    (compile_c("dl_reuse", "O2", O2_FLAGS), a, b)
}

fn utf8(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// The target's state file: B must have been mapped at A's address, else
/// the test would prove nothing.
fn assert_same_base(state: &std::path::Path) {
    let text = std::fs::read_to_string(state).unwrap_or_else(|e| {
        panic!(
            "the target wrote no {} ({e}): it failed before B was loaded",
            state.display()
        )
    });
    let bases: Vec<&str> = text.split_whitespace().skip(1).collect();
    assert!(
        bases.len() == 2 && bases[0] == bases[1] && bases[0] != "0",
        "B was not loaded at A's address: {text:?}"
    );
}

/// Every stack in one line each, and the notes, for assertion messages.
fn describe(report: &Value) -> String {
    let all: Vec<String> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            format!(
                "{} B {:?} truncated {}",
                s["inuse_bytes"],
                names(s),
                s["truncated"]
            )
        })
        .collect();
    format!("{all:#?}\nnotes: {}", report["notes"])
}

/// The stack holding the one block of `bytes`.
fn stack_of(report: &Value, bytes: u64) -> &Value {
    let found: Vec<&Value> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["alloc_bytes"].as_u64() == Some(bytes))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one stack of {bytes} B\n{}",
        describe(report)
    );
    found[0]
}

/// B's block exactly under B's functions, complete; no stack lost.
fn assert_b_named_from_b(report: &Value) {
    let all = describe(report);
    assert_eq!(report["losses"]["stack_lost"], 0, "{all}");
    assert_eq!(
        per_site(report).get("b_plugin_site"),
        Some(&[5555, 1, 5555, 1]),
        "{all}"
    );
    let b = stack_of(report, 5555);
    // plugin_entry's call is a tail call (a jump): no frame of its own.
    assert_eq!(
        names(b).get(..2),
        Some(&["b_plugin_site", "b_plugin_mid"][..]),
        "{all}"
    );
    assert!(names(b).contains(&"main"), "{all}");
    assert_eq!(b["truncated"], false, "{all}");
}

/// A's block exactly under A's functions, complete.
fn assert_a_named_from_a(report: &Value) {
    let all = describe(report);
    assert_eq!(
        per_site(report).get("a_plugin_site"),
        Some(&[4444, 1, 4444, 1]),
        "{all}"
    );
    let a = stack_of(report, 4444);
    assert_eq!(
        names(a).get(..2),
        Some(&["a_plugin_site", "a_plugin_mid"][..]),
        "{all}"
    );
    assert!(!names(a).contains(&"[unknown]"), "{all}");
    assert!(names(a).contains(&"main"), "{all}");
    assert_eq!(a["truncated"], false, "{all}");
}

/// A's block is never named from B: from A if the tracer read the maps
/// while A was mapped, else its leaf is unnamed and a note says why.
fn assert_a_never_named_from_b(report: &Value) {
    let all = describe(report);
    let a = stack_of(report, 4444);
    assert_eq!(a["inuse_bytes"], 4444, "{all}");
    if names(a).first() == Some(&"a_plugin_site") {
        assert_a_named_from_a(report);
        return;
    }
    assert!(
        !names(a).iter().any(|n| n.starts_with("b_")),
        "A's block named from B\n{all}"
    );
    assert_eq!(names(a).first(), Some(&"[unknown]"), "{all}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("loaded in its place"), "{all}");
}

/// Attached by pid and traced through the sequence; returns the report.
/// `loaded_first`: A is loaded before the attach, so the maps read then
/// show it; else A comes and goes in one go after the attach.
fn by_pid_report(tag: &str, extra: &[&str], loaded_first: bool) -> Value {
    let (bin, a, b) = build(tag);
    let state = scratch(&format!("{tag}.state"));
    let _ = std::fs::remove_file(&state);
    let mut target_args = vec![utf8(&a), utf8(&b), utf8(&state)];
    if loaded_first {
        target_args.push("loaded-first");
    }
    let mut target = Target::start(&bin, &target_args);
    let pid = target.pid().to_string();
    let args = [&["--pid", pid.as_str(), "--sample-rate", "1"], extra].concat();
    let tracer = JsonTracer::start(tag, &args);
    target.run_sites();
    assert_same_base(&state);
    tracer.stop().0
}

/// Attached by pid once A is loaded: both named from their own library.
fn by_pid_loaded_first(tag: &str, extra: &[&str]) {
    let report = by_pid_report(tag, extra, true);
    assert_a_named_from_a(&report);
    assert_b_named_from_b(&report);
}

/// Attached by pid before the first dlopen: A comes and goes in one go.
fn by_pid(tag: &str, extra: &[&str]) {
    let report = by_pid_report(tag, extra, false);
    assert_a_never_named_from_b(&report);
    assert_b_named_from_b(&report);
}

/// Started by the tracer (`-- CMD`): the command has no stdin and runs the
/// sequence at once, then exits.
fn as_command(tag: &str, extra: &[&str]) {
    let (bin, a, b) = build(tag);
    let state = scratch(&format!("{tag}.state"));
    let _ = std::fs::remove_file(&state);
    let args = [
        &["--sample-rate", "1"],
        extra,
        &["--", utf8(&bin), utf8(&a), utf8(&b), utf8(&state)],
    ]
    .concat();
    let (report, _) = JsonTracer::spawn(tag, &args).finish();
    assert_same_base(&state);
    assert_a_never_named_from_b(&report);
    assert_b_named_from_b(&report);
}

#[test]
fn a_library_loaded_where_another_was_names_both_by_pid_tables() {
    by_pid_loaded_first("dl-reuse-first-tables", &[]);
}

#[test]
fn a_library_loaded_where_another_was_names_both_by_pid_tables_big_copy() {
    by_pid_loaded_first("dl-reuse-first-tables-16k", &["--stack-bytes", "16384"]);
}

#[test]
fn a_library_loaded_where_another_was_names_both_by_pid_dwarf() {
    by_pid_loaded_first("dl-reuse-first-dwarf", &["--unwind", "dwarf"]);
}

#[test]
fn a_library_replaced_in_one_go_is_not_named_from_the_new_one_by_pid_tables() {
    by_pid("dl-reuse-pid-tables", &[]);
}

#[test]
fn a_library_replaced_in_one_go_is_not_named_from_the_new_one_by_pid_dwarf() {
    by_pid("dl-reuse-pid-dwarf", &["--unwind", "dwarf"]);
}

#[test]
fn a_library_replaced_in_one_go_is_not_named_from_the_new_one_as_command_tables() {
    as_command("dl-reuse-cmd-tables", &[]);
}

#[test]
fn a_library_replaced_in_one_go_is_not_named_from_the_new_one_as_command_dwarf() {
    as_command("dl-reuse-cmd-dwarf", &["--unwind", "dwarf"]);
}
