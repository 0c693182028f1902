//! The report is complete whatever ends the trace: SIGTERM, the target
//! exiting, or the duration.

use crate::{
    harness::{compile_c, root_or_skip, scratch, Target, Tracer},
    sites::{assert_sites_exact, read_json, trace_sites_to_json, FP_FLAGS},
};

#[test]
fn sigterm_during_the_trace_still_writes_the_whole_report() {
    if !root_or_skip("sigterm_during_the_trace_still_writes_the_whole_report") {
        return;
    }
    let bin = compile_c("sites", "fp-sigterm", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let report = trace_sites_to_json(&mut target, "sigterm", true, libc::SIGTERM);
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

/// Attaching and detaching while the target allocates must not confuse
/// entries with returns: a block freed right away is never reported live,
/// and the realloc'd buffer is exactly one live block.
#[test]
fn a_target_busy_during_attach_and_detach_is_counted_right() {
    if !root_or_skip("a_target_busy_during_attach_and_detach_is_counted_right") {
        return;
    }
    let bin = compile_c("steady", "fp", FP_FLAGS);
    let target = Target::start(&bin, &[]);
    let path = scratch("steady.json");
    for round in 0..2 {
        let tracer = Tracer::start(&[
            "--pid",
            &target.pid().to_string(),
            "--duration",
            "1",
            "--format",
            "json",
            "-o",
            path.to_str().expect("utf-8 path"),
        ]);
        let out = tracer.finish();
        assert!(out.status.success(), "tracer failed: {}", out.stderr);
        let report = read_json(&path);
        let sites = crate::sites::per_site(&report);
        let request = sites.get("request").copied().unwrap_or_default();
        let grow = sites.get("grow").copied().unwrap_or_default();
        assert!(
            request[3] > 100 && grow[3] > 100,
            "round {round}: too few calls seen: {sites:?}"
        );
        // The report is the heap at the stop instant, which may fall
        // between one request's malloc(256)/calloc(8, 64) and their frees:
        // at most those two blocks. Stale pairings (the bug this test
        // guards against) left many blocks live, or bytes on wrong stacks.
        let in_flight = [[0, 0], [256, 1], [512, 1], [768, 2]];
        assert!(
            in_flight.contains(&[request[0], request[1]]),
            "round {round}: request keeps nothing beyond one call in flight: {sites:?}"
        );
        // One buffer, or none in the instant between free(buf) and the
        // realloc(NULL) that starts over (once every 256 calls).
        assert!(
            grow[1] <= 1,
            "round {round}: one grow buffer is live: {sites:?}"
        );
        assert_eq!(
            grow[0] % 4096,
            0,
            "round {round}: grow buffer size: {sites:?}"
        );
        let losses = &report["losses"];
        assert_eq!(losses["stale_inflight"], 0, "{losses}");
        assert!(
            !report["notes"].to_string().contains("reused an address"),
            "round {round}: {}",
            report["notes"]
        );
    }
}

/// Ctrl-C while the probes are still being attached (before "tracing")
/// ends the trace with a report, not by killing the tracer.
#[test]
fn ctrl_c_during_attach_still_writes_a_report() {
    if !root_or_skip("ctrl_c_during_attach_still_writes_a_report") {
        return;
    }
    let bin = compile_c("sites", "fp-early-int", FP_FLAGS);
    let target = Target::start(&bin, &[]);
    let path = scratch("early-sigint.json");
    let pid = target.pid().to_string();
    let mut tracer = Tracer::spawn(&[
        "--verbose",
        "--pid",
        &pid,
        "--format",
        "json",
        "-o",
        path.to_str().expect("utf-8 path"),
    ]);
    // --verbose lists each hook once it is attached, before tracing starts.
    tracer.stderr.wait_for(": attached", "first hook attached");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "{:?}: {}", out.status, out.stderr);
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    assert_eq!(report["processes"][0]["pid"], target.pid());
}
