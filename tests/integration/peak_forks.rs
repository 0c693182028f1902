//! `--snapshot-on-peak` under `--follow-forks` (tests/targets/fork_churn.c):
//! a hundred short-lived workers, each one's first allocation a new high of
//! its own process, write no snapshot; a spike of the whole trace still
//! gets one while it is held.

use std::time::{Duration, Instant};

use crate::{
    harness::{
        compile_c, offline::open_dir, read_json, sites::per_site, sites::O2_FLAGS, Target, Tracer,
    },
    peak::{snapshot_files, steps},
};

const MIB: u64 = 1 << 20;
const BASE: u64 = 2 * MIB;
const SPIKE: u64 = 64 * MIB;

/// Waits until a snapshot file satisfies `found` (60 s at most).
fn wait_for_snapshot(
    dir: &std::path::Path,
    what: &str,
    found: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !snapshot_files(dir).iter().any(|p| found(&read_json(p))) {
        assert!(
            Instant::now() < deadline,
            "no snapshot {what} within 60 s: {:?}",
            snapshot_files(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn snapshot_on_peak_skips_workers_starting_and_writes_the_spike() {
    let bin = compile_c("fork_churn", "peak-forks", O2_FLAGS);
    let dir = open_dir("peak-forks");
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let template = dir.join("heap-{n}.json");
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "--follow-forks",
        "--snapshot-on-peak",
        "--format",
        "json",
        "-o",
        template.to_str().expect("utf-8 path"),
    ]);
    let site =
        |report: &serde_json::Value, name: &str| per_site(report).get(name).map_or(0, |s| s[0]);
    steps(&mut target, &["base"]);
    // The first snapshot may catch the base part way.
    wait_for_snapshot(&dir, "of the base", |r| site(r, "site_base") > 0);
    // 100 workers one after another, about 5 s: each one's 256 KiB is a
    // new high of its process, never 10 % (nor 1 MiB) more for the trace.
    steps(&mut target, &["churn 100", "spike"]);
    let enough = ((BASE + SPIKE) as f64 / 1.1) as u64 - BASE;
    wait_for_snapshot(&dir, "of the spike", |r| site(r, "site_spike") >= enough);
    let files = snapshot_files(&dir);
    // Written after the whole base and before the spike: the base's own
    // (when the first caught it part way), and none while workers started.
    let between: Vec<_> = files
        .iter()
        .filter(|p| {
            let r = read_json(p);
            site(&r, "site_base") == BASE && site(&r, "site_spike") == 0
        })
        .collect();
    assert!(
        between.len() <= 1,
        "snapshots written while only workers started: {between:?}"
    );
    // The base, and the spike caught once or in a few steps as it grew.
    assert!(files.len() <= 4, "{files:?}");
    steps(&mut target, &["free"]);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    target.send("quit");
    target.wait_exit();
}
