//! Uprobe sessions skip the return probe of calls that are not recorded,
//! in the scopes whose probes fire for every process mapping the file
//! (`--binary`, `--cgroup`) as under `--pid`. The tracer
//! counts the return runs in the kernel (`--verbose`); when sampling, they
//! follow the recorded calls, not all calls. Before the entry programs
//! returned their value, every call ran its return (339264 here).

use std::path::PathBuf;

use serde_json::Value;

use crate::harness::{
    cgroup::V2Cgroup, compile_c, scratch, sites::O2_FLAGS, Finished, JsonTracer, Target,
};

/// Allocating calls accuracy.c makes after "go": keep_1k (128 MiB in
/// 1 KiB blocks), churn (200000), keep_16k (128 MiB in 16 KiB blocks).
const CALLS: u64 = (128 << 10) + 200_000 + (128 << 20) / 16384;

/// At the default rate (64 KiB) about 5000 of them are recorded (the
/// 256 MiB kept plus the churn's 64 MiB, over 64 KiB): an eighth of the
/// calls is over 8 times that, and far below one return run per call.
const MOST_RETURN_RUNS: u64 = CALLS / 8;

/// accuracy.c built and copied to a scratch `dir/name`, so that `--binary`
/// traces this test's process only.
fn accuracy_copy(tag: &str) -> PathBuf {
    let built = compile_c("accuracy", "O2", O2_FLAGS);
    let dir = scratch(tag);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let copy = dir.join("memtrace_sess");
    std::fs::copy(&built, &copy).expect("copy target");
    copy
}

/// The counts of the --verbose line "uprobe sessions: N return runs in
/// traced processes, M in others".
fn return_runs(out: &Finished) -> (u64, u64) {
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("uprobe sessions: "))
        .unwrap_or_else(|| panic!("no return-run line:\n{}", out.stderr));
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match numbers[..] {
        [traced, others, ..] => (traced, others),
        _ => panic!("two counts expected: {line}"),
    }
}

/// Every allocating function ran as a uprobe session.
fn assert_sessions(report: &Value) {
    for h in report["hooks"].as_array().expect("hooks") {
        let status = h["status"].as_str().unwrap_or("");
        if h["function"] != "free" && status.starts_with("attached") {
            assert_eq!(status, "attached (uprobe session)", "{h}");
        }
    }
}

/// Runs accuracy.c under a sampling tracer with `scope` and returns the
/// return runs in traced processes.
fn traced_return_runs(tag: &str, target: &mut Target, scope: &[&str]) -> u64 {
    let args = [&["-v"], scope].concat();
    let tracer = JsonTracer::start_sampling(tag, &args);
    target.run_sites();
    let (report, out) = tracer.stop();
    assert!(report["sample_rate"].as_u64() > Some(1), "sampling");
    assert_sessions(&report);
    let churn_recorded = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .any(|s| s["pid"] == target.pid() && s["alloc_objects"].as_u64() > Some(0));
    assert!(churn_recorded, "{tag}: the target was traced");
    let (traced, _) = return_runs(&out);
    assert!(
        traced > 0 && traced <= MOST_RETURN_RUNS,
        "{tag}: {traced} return runs for {CALLS} calls (at most {MOST_RETURN_RUNS} expected)"
    );
    traced
}

#[test]
fn binary_and_cgroup_scopes_skip_the_return_of_unrecorded_calls() {
    let bin = accuracy_copy("sessions-binary");
    let mut target = Target::start(&bin, &[]);
    let path = bin.to_str().expect("utf-8 path");
    traced_return_runs("sessions-binary", &mut target, &["--binary", path]);

    let cgroup = V2Cgroup::new("sessions");
    let mut target = Target::start(&bin, &[]);
    cgroup.add(target.pid());
    let path = cgroup.path();
    traced_return_runs("sessions-cgroup", &mut target, &["--cgroup", &path]);
}

#[test]
fn pid_scope_skips_the_return_of_unrecorded_calls_and_counts_no_other_process() {
    let bin = accuracy_copy("sessions-pid");
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let args = ["-v", "--pid", &pid];
    let tracer = JsonTracer::start_sampling("sessions-pid", &args);
    target.run_sites();
    let (report, out) = tracer.stop();
    assert_sessions(&report);
    let (traced, others) = return_runs(&out);
    assert!(traced > 0 && traced <= MOST_RETURN_RUNS, "{traced}");
    // A per-process link: the kernel runs its programs for that process
    // only (uprobe_prog_run), even where another tracer's probe on the same
    // instruction makes every process hit it.
    assert_eq!(others, 0);
}
