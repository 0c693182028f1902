//! Exact mode matches frees in user space: BPF sends every free() and keeps
//! no LIVE entry of a reported block, so frees of blocks from before the
//! trace reach user space, which counts them, and --max-live bounds the
//! live set user space holds.

use serde_json::Value;

use crate::harness::{
    compile_c, inuse_from,
    sites::{assert_no_losses, FP_FLAGS},
    JsonTracer, Target,
};

fn total(report: &Value, field: &str) -> u64 {
    report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| s[field].as_u64().expect(field))
        .sum()
}

/// 500 blocks allocated before the trace and freed during it: 500 unknown
/// frees, said to be of blocks from before the trace, and in-use is
/// exactly the 3 blocks allocated during the trace.
#[test]
fn exact_mode_counts_frees_of_blocks_from_before_the_trace_and_keeps_in_use_exact() {
    let bin = compile_c("older_blocks", "fp", FP_FLAGS);
    let mut target = Target::start(&bin, &["free"]);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start("exact-older-frees", &["--pid", &pid]);
    target.run_sites();
    let (report, _) = tracer.stop();
    let losses = &report["losses"];
    assert_eq!(losses["unknown_frees"], 500, "{losses}");
    assert_no_losses(&report);
    assert_eq!(inuse_from(&report, "keep_new"), (3, 3 * 4242));
    assert_eq!(total(&report, "inuse_objects"), 3, "{}", report["stacks"]);
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("500 frees of blocks the trace never saw allocated")
            && notes.contains("before the trace started"),
        "{notes}"
    );
}

/// With --max-live 16, of 500 blocks kept during the trace 16 are tracked
/// and the other 484 counted as live_map_full: the live set user space
/// holds stays within the bound.
#[test]
fn exact_mode_tracks_at_most_max_live_blocks_and_counts_the_rest() {
    let bin = compile_c("older_blocks", "fp", FP_FLAGS);
    let mut target = Target::start(&bin, &["hold"]);
    let pid = target.pid().to_string();
    let args = ["--pid", pid.as_str(), "--max-live", "16"];
    let tracer = JsonTracer::start("exact-max-live", &args);
    target.run_sites();
    let (report, _) = tracer.stop();
    let losses = &report["losses"];
    assert_eq!(losses["live_map_full"], 484, "{losses}");
    assert_eq!(inuse_from(&report, "hold"), (16, 16 * 1000));
    assert_eq!(total(&report, "inuse_objects"), 16, "{}", report["stacks"]);
}
