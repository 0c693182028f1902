//! `memtrace-bpf -- CMD`: the command is traced from its first instruction.

use crate::{
    harness::{compile_c, root_or_skip, scratch, Tracer},
    sites::{read_json, O2_FLAGS},
};

#[test]
fn an_allocation_in_the_first_line_of_main_is_reported_with_the_exit_status() {
    if !root_or_skip("an_allocation_in_the_first_line_of_main_is_reported_with_the_exit_status") {
        return;
    }
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    // It exits as soon as it has allocated, before the tracer's next look
    // at the ring buffer: held at its exit, it is still named, every time.
    for run in 0..3 {
        let path = scratch(&format!("first_line-{run}.json"));
        let tracer = Tracer::spawn(&[
            "--format",
            "json",
            "-o",
            path.to_str().expect("utf-8 path"),
            "--",
            bin.to_str().expect("utf-8 path"),
        ]);
        let out = tracer.finish();
        assert!(out.status.success(), "tracer failed: {}", out.stderr);
        let report = read_json(&path);
        assert_eq!(report["end_reason"], "target exited");
        let process = &report["processes"][0];
        assert_eq!(process["exit_status"], "exited with status 3", "{process}");
        assert_eq!(process["exited"], true);
        let in_main = report["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .find(|s| s["frames"][0]["function"] == "main")
            .unwrap_or_else(|| panic!("run {run}: no allocation from main: {}", report["stacks"]));
        assert_eq!(in_main["inuse_bytes"], 12345, "{in_main}");
        assert_eq!(in_main["inuse_objects"], 1, "{in_main}");
    }
}

#[test]
fn a_command_that_cannot_be_found_is_an_error() {
    if !root_or_skip("a_command_that_cannot_be_found_is_an_error") {
        return;
    }
    let out = Tracer::spawn(&["--", "/nonexistent/memtrace-test-cmd"]).finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("command not found"), "{}", out.stderr);
}

#[test]
fn a_stripped_static_command_is_refused_with_the_reason() {
    if !root_or_skip("a_stripped_static_command_is_refused_with_the_reason") {
        return;
    }
    let bin = compile_c("first_line", "static-stripped", &["-O1", "-static", "-s"]);
    let out = Tracer::spawn(&["--", bin.to_str().expect("utf-8 path")]).finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is statically linked and stripped"),
        "{}",
        out.stderr
    );
}
