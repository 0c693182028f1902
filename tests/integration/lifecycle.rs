//! The report is complete whatever ends the trace: SIGTERM, the target
//! exiting, or the duration.

use crate::{
    harness::{compile_c, root_or_skip, scratch, Target, Tracer},
    sites::{assert_sites_exact, read_json, FP_FLAGS},
};

#[test]
fn sigterm_during_the_trace_still_writes_the_whole_report() {
    if !root_or_skip("sigterm_during_the_trace_still_writes_the_whole_report") {
        return;
    }
    let bin = compile_c("sites", "fp-sigterm", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let path = scratch("sigterm.json");
    let tracer = Tracer::start(&[
        "--pid",
        &target.pid().to_string(),
        "--format",
        "json",
        "-o",
        path.to_str().expect("utf-8 path"),
    ]);
    target.run_sites();
    tracer.signal(libc::SIGTERM);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    assert_sites_exact(&report);
}

#[test]
fn a_target_that_exits_mid_trace_still_gets_its_report_with_names() {
    if !root_or_skip("a_target_that_exits_mid_trace_still_gets_its_report_with_names") {
        return;
    }
    let bin = compile_c("sites", "fp-exit", FP_FLAGS);
    let mut target = Target::start(&bin, &["exit"]);
    let pid = target.pid();
    let path = scratch("exit.json");
    let tracer = Tracer::start(&[
        "--pid",
        &pid.to_string(),
        "--duration",
        "120",
        "--format",
        "json",
        "-o",
        path.to_str().expect("utf-8 path"),
    ]);
    target.run_sites();
    assert!(target.wait_exit().success());
    // The tracer notices the exit by itself, long before the duration.
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "target exited");
    assert_eq!(report["processes"][0]["pid"], pid);
    assert_eq!(report["processes"][0]["exited"], true);
    // What it never freed is what it leaked; frames were named after exit.
    assert_sites_exact(&report);
}

#[test]
fn duration_ends_the_trace_with_a_text_report() {
    if !root_or_skip("duration_ends_the_trace_with_a_text_report") {
        return;
    }
    let bin = compile_c("sites", "fp-duration", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let tracer = Tracer::start(&["--pid", &target.pid().to_string(), "--duration", "3"]);
    target.run_sites();
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    assert!(out.stdout.contains("duration elapsed"), "{}", out.stdout);
    assert!(out.stdout.contains("site_malloc"), "{}", out.stdout);
}
