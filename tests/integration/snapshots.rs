//! Snapshots taken while tracing (`--interval`):
//! each agrees with what the target had done when it was taken, the trace
//! goes on, and the final report is the last snapshot.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c, read_json, scratch,
    sites::{assert_no_losses, per_site, O2_FLAGS},
    Target, Tracer,
};

fn snapshot_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("heap-{n}.json"))
}

/// The number of the newest snapshot written so far (0 if none).
fn newest(dir: &Path) -> u32 {
    (1..)
        .take_while(|&n| snapshot_path(dir, n).exists())
        .last()
        .unwrap_or(0)
}

/// Waits for snapshot `n` (written whole: files are renamed into place).
fn wait_for_snapshot(dir: &Path, n: u32) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    let path = snapshot_path(dir, n);
    while !path.exists() {
        assert!(Instant::now() < deadline, "no snapshot {n} within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    read_json(&path)
}

/// [in-use bytes, in-use objects, alloc bytes, alloc objects] of each site.
fn sites(report: &Value) -> [[u64; 4]; 3] {
    let got = per_site(report);
    ["site_a", "site_b", "site_c"].map(|s| got.get(s).copied().unwrap_or_default())
}

/// Runs step `step` of phases.c and returns the first snapshot begun
/// after it was done (the one after the snapshot that may be under way).
fn step_then_snapshot(target: &mut Target, step: &str, dir: &Path) -> Value {
    target.send(step);
    target.wait_for(&format!("did {step}"));
    wait_for_snapshot(dir, newest(dir) + 2)
}

#[test]
fn snapshots_during_a_trace_and_the_final_report_agree_with_the_target() {
    let bin = compile_c("phases", "snapshots", O2_FLAGS);
    let dir = scratch("snapshots");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let template = dir.join("heap-{n}.json");
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "--interval",
        "0.3",
        "--format",
        "json",
        "-o",
        template.to_str().expect("utf-8 path"),
    ]);
    let after_a = step_then_snapshot(&mut target, "a", &dir);
    assert_eq!(
        sites(&after_a),
        [[10_000, 10, 10_000, 10], [0; 4], [0; 4]],
        "{after_a}"
    );
    let after_b = step_then_snapshot(&mut target, "b", &dir);
    assert_eq!(
        sites(&after_b),
        [[0, 0, 10_000, 10], [40_000, 20, 40_000, 20], [0; 4]],
        "{after_b}"
    );
    // Snapshots say the trace went on, and how long it had run.
    assert!(
        after_b["end_reason"]
            .as_str()
            .is_some_and(|r| r.contains("the trace went on")),
        "{}",
        after_b["end_reason"]
    );
    assert!(after_b["duration_secs"].as_f64() > after_a["duration_secs"].as_f64());
    target.send("c");
    target.wait_for("did c");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    // The final report is the last numbered file.
    let last = newest(&dir);
    let last_report = read_json(&snapshot_path(&dir, last));
    assert_eq!(last_report["end_reason"], "interrupted (SIGINT)");
    assert_eq!(
        sites(&last_report),
        [[0, 0, 10_000, 10], [0, 0, 40_000, 20], [5555, 1, 5555, 1]],
        "{last_report}"
    );
    assert_no_losses(&last_report);
    assert!(
        out.stderr.contains(&format!("heap-{last}.json")),
        "{}",
        out.stderr
    );
    target.send("quit");
    target.wait_exit();
}
