//! `--min-age SECS`: only allocations live at least SECS
//! when the report is made count as in use, in the final report (JSON,
//! text), in --interval snapshots and in --serve's `?min_age=`; allocated
//! counts still count everything.
//!
//! aging.c allocates a set when told (a: 10 x 1000 bytes at site_old),
//! then, well past the min age, a second one (b: 20 x 2000 at site_new)
//! just before the trace ends: only the first is old enough. The margins
//! are seconds on both sides (a loaded machine delays a snapshot, never
//! by that much).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    http::{get, get_text, served_addr, site_values},
    parse_report, scratch,
    sites::{assert_no_losses, per_site, O2_FLAGS},
    JsonTracer, Target, Tracer,
};

/// --min-age given to the tracer.
const MIN_AGE: &str = "4";
/// How long set a lives before set b is allocated: MIN_AGE and a margin
/// of 4 s (set a must be old enough in every report after it).
const OLD: Duration = Duration::from_secs(8);

/// [in-use bytes, in-use objects, alloc bytes, alloc objects] when only
/// set a is old enough.
const OLD_SET: [u64; 4] = [10_000, 10, 10_000, 10];
const NEW_SET_TOO_YOUNG: [u64; 4] = [0, 0, 40_000, 20];

/// Starts aging.c (it waits for its steps).
fn target_with_an_old_set(tag: &str) -> Target {
    let bin = compile_c("aging", tag, O2_FLAGS);
    Target::start(&bin, &[])
}

/// Step a, `OLD` later `before_new` and step b.
fn allocate_old_then_new(target: &mut Target, before_new: impl FnOnce()) {
    target.send("a");
    target.wait_for("did a");
    // Not a timing assertion: the ages are what is under test.
    std::thread::sleep(OLD);
    before_new();
    target.send("b");
    target.wait_for("did b");
}

fn sites(report: &Value) -> [[u64; 4]; 2] {
    let got = per_site(report);
    ["site_old", "site_new"].map(|s| got.get(s).copied().unwrap_or_default())
}

#[test]
fn min_age_counts_only_the_old_set_in_json_and_over_http() {
    let mut target = target_with_an_old_set("min-age-json");
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(
        "min-age-json",
        &[
            "--pid",
            &pid,
            "--min-age",
            MIN_AGE,
            "--serve",
            "127.0.0.1:0",
        ],
    );
    let addr = served_addr(&mut tracer);
    for bad in ["-1", "nan", "inf", "x", "1e99"] {
        for endpoint in ["/debug/pprof/heap?", "/profile.json?", "/flamegraph.svg?"] {
            let (status, body) = get_text(&addr, &format!("{endpoint}min_age={bad}"));
            assert_eq!(status, 400, "{endpoint}min_age={bad}: {body}");
            assert!(body.contains("?min_age= takes"), "{body}");
        }
    }
    allocate_old_then_new(&mut target, || {});
    // Right after b, set b is seconds younger than the min age: what
    // follows until the report is quick.
    let (status, heap) = get(&addr, &format!("/debug/pprof/heap?min_age={MIN_AGE}"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&heap));
    let served = |query: &str| {
        let (status, body) = get_text(&addr, &format!("/profile.json{query}"));
        assert_eq!(status, 200, "{body}");
        parse_report(&body)
    };
    // Without ?min_age= the trace's --min-age applies; 0 counts every block.
    let default = served("");
    let every_block = served("?min_age=0");
    let flamegraph = |query: &str| {
        let (status, svg) = get_text(&addr, &format!("/flamegraph.svg?view=inuse-space{query}"));
        assert_eq!(status, 200, "{svg}");
        svg
    };
    let (old_only, both) = (flamegraph("&min_age=4"), flamegraph("&min_age=0"));
    let (report, out) = tracer.stop();
    assert!(!out.stderr.contains("events/s"), "{}", out.stderr);

    assert_eq!(report["min_age_secs"], 4.0, "{}", report["min_age_secs"]);
    assert_eq!(sites(&report), [OLD_SET, NEW_SET_TOO_YOUNG], "{report}");
    assert_eq!(
        [
            &report["totals"]["inuse_bytes"],
            &report["totals"]["inuse_objects"],
            &report["totals"]["alloc_bytes"],
            &report["totals"]["alloc_objects"],
        ],
        [10_000, 10, 50_000, 30]
    );
    assert_no_losses(&report);
    assert_eq!(default["min_age_secs"], 4.0);
    assert_eq!(sites(&default), [OLD_SET, NEW_SET_TOO_YOUNG], "{default}");
    assert_eq!(every_block["min_age_secs"], Value::Null);
    assert_eq!(
        sites(&every_block),
        [OLD_SET, [40_000, 20, 40_000, 20]],
        "{every_block}"
    );
    // The in-use flamegraph has only the frames of what is old enough.
    assert!(old_only.contains("site_old"), "{old_only}");
    assert!(!old_only.contains("site_new"), "{old_only}");
    assert!(
        both.contains("site_old") && both.contains("site_new"),
        "{both}"
    );
    // The pprof, as go tool pprof reads it: (alloc_objects, alloc_space,
    // inuse_objects, inuse_space) per leaf, and the min age in a comment.
    let raw = pprof_raw(&heap);
    assert_eq!(site_values(&raw, "site_old"), [10, 10_000, 10, 10_000]);
    assert_eq!(site_values(&raw, "site_new"), [20, 40_000, 0, 0]);
    assert!(
        raw.contains("Comment: min age: 4 s: in use counts only allocations live at least"),
        "{raw}"
    );
    target.send("quit");
    target.wait_exit();
}

/// `go tool pprof -raw` of a served pprof body.
fn pprof_raw(body: &[u8]) -> String {
    let dir = scratch("min-age-pprof");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let file = dir.join("heap.pb.gz");
    std::fs::write(&file, body).expect("write pprof");
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(&file)
        .env("PPROF_TMPDIR", &dir)
        .env("HOME", &dir)
        .output()
        .expect("run go tool pprof (Debian's golang-go, cargo xtask setup)");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof failed: {}\n{raw}",
        String::from_utf8_lossy(&out.stderr)
    );
    raw
}

fn snapshot_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("heap-{n}.txt"))
}

/// The number of the newest snapshot written so far (0 if none).
fn newest(dir: &Path) -> u32 {
    (1..)
        .take_while(|&n| snapshot_path(dir, n).exists())
        .last()
        .unwrap_or(0)
}

fn wait_for_snapshot(dir: &Path, n: u32) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let path = snapshot_path(dir, n);
    while !path.exists() {
        assert!(Instant::now() < deadline, "no snapshot {n} within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(&path).expect("read snapshot")
}

#[test]
fn min_age_in_text_reports_and_interval_snapshots() {
    let mut target = target_with_an_old_set("min-age-text");
    let pid = target.pid().to_string();
    let dir = scratch("min-age-text");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let template = dir.join("heap-{n}.txt");
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "--min-age",
        MIN_AGE,
        "--interval",
        "1",
        "-o",
        template.to_str().expect("utf-8 path"),
    ]);
    let mut before_b = String::new();
    allocate_old_then_new(&mut target, || {
        // A snapshot begun at least OLD - 1 s after set a.
        before_b = wait_for_snapshot(&dir, newest(&dir) + 1);
    });
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    let last = std::fs::read_to_string(snapshot_path(&dir, newest(&dir))).expect("final report");
    assert!(last.contains("ended:      interrupted (SIGINT)"), "{last}");
    for report in [&before_b, &last] {
        assert!(
            report.contains(
                "  min age:    4 s: in use counts only allocations live at least that long; \
                 allocated counts every allocation"
            ),
            "{report}"
        );
        assert!(
            report.contains("#1  10000 bytes in 10 objects (allocated: 10000 bytes in 10 objects)"),
            "{report}"
        );
    }
    assert!(
        last.contains("  in use:     9.8 KiB (10000 bytes) in 10 objects\n"),
        "{last}"
    );
    assert!(
        last.contains("  allocated:  48.8 KiB (50000 bytes) in 30 objects\n"),
        "{last}"
    );
    // site_new's stack has nothing old enough: not listed among in-use
    // (the peak's section, after, lists what was in use at the peak).
    let in_use = last.split("Heap at its peak").next().unwrap_or(&last);
    assert!(!in_use.contains("site_new"), "{last}");
    assert!(
        last.contains("1 stack with nothing left in use not listed"),
        "{last}"
    );
    target.send("quit");
    target.wait_exit();
}

#[test]
fn min_age_must_be_a_number_of_seconds() {
    for bad in ["-1", "NaN", "inf", "1e10"] {
        let out = Command::new(crate::harness::TRACER)
            .args(["--pid", "1", "--min-age", bad])
            .output()
            .expect("run memtrace-bpf");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--min-age {bad}: {stderr}");
        assert!(
            stderr.contains(
                "--min-age takes the seconds an allocation must have been live to count as in \
                 use, from 0 to 31536000 (a year), got "
            ),
            "--min-age {bad}: {stderr}"
        );
    }
}
