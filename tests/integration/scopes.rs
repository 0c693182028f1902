//! Several processes: every process running a binary (`--binary`), and
//! every process on the machine (no target, filtered by `--comm`).

use serde_json::Value;

use crate::{
    harness::{compile_c, root_or_skip, scratch, Target, Tracer},
    sites::{per_site, read_json, EXPECTED_PER_THREAD, O2_FLAGS},
};

/// The report's per-site numbers for one process equal the known ones.
fn assert_process_exact(report: &Value, pid: u32) {
    let mine = serde_json::json!({
        "stacks": report["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .filter(|s| s["pid"] == pid)
            .cloned()
            .collect::<Vec<_>>()
    });
    let got = per_site(&mine);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * 2);
        assert_eq!(got.get(*site), Some(&want), "pid {pid}, {site}: {got:#?}");
    }
    let listed = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .any(|p| p["pid"] == pid);
    assert!(
        listed,
        "pid {pid} is not in processes: {}",
        report["processes"]
    );
}

/// `sites` built into `dir/name`, so that two copies differ in path but
/// share a process name.
fn sites_copy(tag: &str, dir: &str, name: &str) -> std::path::PathBuf {
    let built = compile_c("sites", tag, O2_FLAGS);
    let dir = scratch(dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let copy = dir.join(name);
    std::fs::copy(&built, &copy).expect("copy target");
    copy
}

#[test]
fn binary_traces_running_and_newly_started_processes_separately() {
    if !root_or_skip("binary_traces_running_and_newly_started_processes_separately") {
        return;
    }
    let bin = sites_copy("binary", "binary-scope", "memtrace_bin");
    let mut early = Target::start(&bin, &[]);
    let path = scratch("binary.json");
    let tracer = Tracer::start(&[
        "--binary",
        bin.to_str().expect("utf-8 path"),
        "--format",
        "json",
        "-o",
        path.to_str().expect("utf-8 path"),
    ]);
    // A second process, started a second after the tracer.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mut late = Target::start(&bin, &[]);
    // New processes are picked up within 100 ms; leave margin.
    std::thread::sleep(std::time::Duration::from_millis(500));
    early.run_sites();
    late.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    let report = read_json(&path);
    assert!(
        report["target"]
            .as_str()
            .unwrap_or("")
            .starts_with("binary "),
        "{}",
        report["target"]
    );
    assert_process_exact(&report, early.pid());
    assert_process_exact(&report, late.pid());
}

#[test]
fn system_wide_sees_two_programs_and_reports_them_separately() {
    if !root_or_skip("system_wide_sees_two_programs_and_reports_them_separately") {
        return;
    }
    // Different programs (different files and builds), one process name,
    // so that --comm keeps the rest of the machine out of the trace.
    let a = sites_copy("sw-a", "system-wide-a", "memtrace_sw");
    let b = sites_copy("sw-b", "system-wide-b", "memtrace_sw");
    let mut first = Target::start(&a, &[]);
    let mut second = Target::start(&b, &[]);
    let path = scratch("system-wide.json");
    let tracer = Tracer::start(&[
        "--comm",
        "memtrace_sw",
        "--format",
        "json",
        "-o",
        path.to_str().expect("utf-8 path"),
    ]);
    first.run_sites();
    second.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    assert!(
        out.stderr.contains("every process"),
        "the cost warning: {}",
        out.stderr
    );
    let report = read_json(&path);
    assert_eq!(report["target"], "system-wide");
    assert_process_exact(&report, first.pid());
    assert_process_exact(&report, second.pid());
    let pids: Vec<u64> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert_eq!(
        pids.len(),
        2,
        "only the two programs: {}",
        report["processes"]
    );
}
