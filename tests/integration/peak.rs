//! The heap at its peak (docs/peak.md), on tests/targets/spike.c:
//! a 4 MiB base, a slow leak, a 96 MiB burst freed later, then a lower
//! burst. Exact mode gives every site's bytes at the peak exactly (the
//! lower burst 0); the default sampling rate gives the big burst within
//! 10 %; `go tool pprof -sample_index=peak_space` reads the peak; `report`
//! and the collapsed view show it; `--snapshot-on-peak` leaves a snapshot
//! of the burst on disk while it is held.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    offline::{as_nobody, collapsed_by_leaf, ok, open_dir, share},
    pprof::pprof,
    read_json,
    sites::{assert_no_losses, per_site, O2_FLAGS},
    JsonTracer, Target, Tracer,
};

const MIB: u64 = 1 << 20;
const BASE: u64 = 4 * MIB;
const LEAK_STEP: u64 = 10 * 1000;
const BURST: u64 = 96 * MIB;
const BURST_BLOCKS: u64 = 3072;

/// Each step of spike.c, acknowledged before the next.
pub(crate) fn steps(target: &mut Target, steps: &[&str]) {
    for step in steps {
        target.send(step);
        target.wait_for(&format!("did {step}"));
    }
}

/// [peak bytes, peak objects] of each stack, summed by leaf function.
fn at_peak(report: &Value) -> BTreeMap<String, [u64; 2]> {
    let mut sums = BTreeMap::new();
    for stack in report["stacks"].as_array().expect("stacks array") {
        let Some(leaf) = stack["frames"][0]["function"].as_str() else {
            continue;
        };
        let e: &mut [u64; 2] = sums.entry(leaf.to_string()).or_default();
        e[0] += stack["peak_inuse_bytes"].as_u64().expect("peak bytes");
        e[1] += stack["peak_inuse_objects"].as_u64().expect("peak objects");
    }
    sums
}

#[test]
fn exact_mode_gives_every_sites_bytes_at_the_peak() {
    let bin = compile_c("spike", "peak-exact", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid();
    let tracer = JsonTracer::start("peak-exact", &["--pid", &pid.to_string()]);
    steps(
        &mut target,
        &["base", "leak", "burst", "free", "leak", "low"],
    );
    let (report, _) = tracer.stop();
    assert_no_losses(&report);
    let peak = at_peak(&report);
    let expected = [
        ("site_base", [BASE, 64]),
        ("site_leak", [LEAK_STEP, 10]),
        ("site_burst", [BURST, BURST_BLOCKS]),
        ("site_low", [0, 0]),
    ];
    for (site, want) in expected {
        assert_eq!(peak.get(site), Some(&want), "{site}: {peak:?}");
    }
    // At the end: the base and both leaks, nothing of the bursts.
    let end = per_site(&report);
    assert_eq!(end["site_leak"][..2], [2 * LEAK_STEP, 20]);
    assert_eq!(end["site_burst"][..2], [0, 0]);
    // The process's peak is the sum of its stacks' then, at a time
    // within the trace.
    let p = &crate::harness::process_entry(&report, pid)["peak"];
    let total: [u64; 2] = peak
        .values()
        .fold([0, 0], |a, v| [a[0] + v[0], a[1] + v[1]]);
    assert_eq!(
        [p["inuse_bytes"].as_u64(), p["inuse_objects"].as_u64()],
        [Some(total[0]), Some(total[1])],
        "{p}"
    );
    assert_eq!(total, [BASE + LEAK_STEP + BURST, 64 + 10 + BURST_BLOCKS]);
    let secs = p["secs"].as_f64().expect("secs");
    assert!(
        secs > 0.0 && secs <= report["duration_secs"].as_f64().expect("duration"),
        "{p}"
    );
    assert_eq!(
        report["totals"]["peak_inuse_bytes"].as_u64(),
        Some(total[0]),
        "one process: its peak"
    );
    target.send("quit");
    target.wait_exit();
    saved_report_and_views(&crate::harness::scratch("peak-exact.json"));
}

/// `report` re-renders the saved JSON with its peak (text and the
/// peak-space collapsed view); a file written before peaks were tracked
/// still loads, without the section.
fn saved_report_and_views(file: &Path) {
    let dir = open_dir("peak-saved");
    let saved = dir.join("spike.json");
    std::fs::copy(file, &saved).expect("copy the report");
    let text = std::fs::read_to_string(file).expect("read the report");
    let mut old: Value = serde_json::from_str(&text).expect("JSON");
    for stack in old["stacks"].as_array_mut().expect("stacks") {
        let stack = stack.as_object_mut().expect("stack");
        stack.remove("peak_inuse_bytes");
        stack.remove("peak_inuse_objects");
    }
    for p in old["processes"].as_array_mut().expect("processes") {
        p.as_object_mut().expect("process").remove("peak");
    }
    old["totals"]
        .as_object_mut()
        .expect("totals")
        .retain(|k, _| !k.starts_with("peak_"));
    let old_file = dir.join("old.json");
    std::fs::write(&old_file, old.to_string()).expect("write");
    share(&dir);
    let text = ok(&as_nobody(&[OsStr::new("report"), saved.as_os_str()]));
    let section = text
        .split("Heap at its peak")
        .nth(1)
        .unwrap_or_else(|| panic!("no peak section in:\n{text}"));
    assert!(
        section.contains(&format!(
            "{} bytes) in {} objects at ",
            BASE + LEAK_STEP + BURST,
            64 + 10 + BURST_BLOCKS
        )),
        "{section}"
    );
    assert!(
        section.contains(&format!("#1  {BURST} bytes in {BURST_BLOCKS} objects at the peak (at the end: 0 bytes in 0 objects)")),
        "{section}"
    );
    let collapsed = ok(&as_nobody(&[
        OsStr::new("report"),
        saved.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
        OsStr::new("--view"),
        OsStr::new("peak-space"),
    ]));
    let by_leaf = collapsed_by_leaf(&collapsed);
    assert_eq!(
        by_leaf.get("site_burst"),
        Some(&(BURST as i64)),
        "{collapsed}"
    );
    assert_eq!(by_leaf.get("site_low"), None, "{collapsed}");
    let text = ok(&as_nobody(&[OsStr::new("report"), old_file.as_os_str()]));
    assert!(!text.contains("Heap at its peak"), "{text}");
    assert!(text.contains("site_base"), "{text}");
    // diff: the peak view of the new file against the old one.
    let diff = ok(&as_nobody(&[
        OsStr::new("diff"),
        old_file.as_os_str(),
        saved.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
        OsStr::new("--view"),
        OsStr::new("peak-space"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&diff).get("site_burst"),
        Some(&(BURST as i64)),
        "{diff}"
    );
}

#[test]
fn default_sampling_gives_the_big_burst_at_the_peak_within_10_percent() {
    let bin = compile_c("spike", "peak-sampled", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid();
    let tracer = JsonTracer::start_sampling("peak-sampled", &["--pid", &pid.to_string()]);
    steps(&mut target, &["base", "leak", "burst", "free", "low"]);
    let (report, _) = tracer.stop();
    let peak = at_peak(&report);
    // 3072 blocks of 32 KiB at a mean rate of 64 KiB: the estimate's
    // relative standard deviation is about 2.2 %, so 10 % is 4.5 of them.
    let burst = peak.get("site_burst").copied().unwrap_or_default()[0] as f64;
    assert!(
        (burst - BURST as f64).abs() <= 0.1 * BURST as f64,
        "site_burst at the peak: {burst} for {BURST}: {peak:?}"
    );
    // The lower burst came after the peak: none of it was there.
    assert_eq!(peak.get("site_low").copied().unwrap_or_default(), [0, 0]);
    let p = &crate::harness::process_entry(&report, pid)["peak"];
    assert!(
        p["inuse_bytes"].as_u64().is_some_and(|b| b as f64 >= burst),
        "{p}"
    );
    target.send("quit");
    target.wait_exit();
}

#[test]
fn go_tool_pprof_reads_the_peak_as_a_sample_index() {
    let bin = compile_c("spike", "peak-pprof", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let file = crate::harness::scratch("peak.pb.gz");
    let path = file.to_str().expect("utf-8 scratch path");
    let tracer = Tracer::start(&["--format", "pprof", "-o", path, "--pid", &pid]);
    steps(&mut target, &["base", "burst", "free", "low"]);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    target.send("quit");
    target.wait_exit();
    // -traces lists each sample with its value of the chosen type.
    let traces = pprof(&["-traces", "-sample_index=peak_space"], &file);
    assert!(traces.contains("Type: peak_space"), "{traces}");
    let by_leaf = traces_by_leaf(&traces);
    assert_eq!(by_leaf.get("site_burst"), Some(&BURST), "{traces}");
    assert_eq!(by_leaf.get("site_base"), Some(&BASE), "{traces}");
    // Its sample is there (it allocated), with 0 at the peak.
    assert_eq!(by_leaf.get("site_low"), Some(&0), "{traces}");
    let traces = pprof(&["-traces", "-sample_index=peak_objects"], &file);
    assert_eq!(
        traces_by_leaf(&traces).get("site_burst"),
        Some(&BURST_BLOCKS),
        "{traces}"
    );
}

/// `go tool pprof -traces` with `-unit` left alone: each trace is
/// `-----------+----`, its labels, then `VALUE  leaf` and its callers; values in bytes
/// come with units (`96MB`), counts bare. Summed by leaf, in bytes.
fn traces_by_leaf(traces: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for trace in traces
        .split("-----------+-------------------------------------------------------")
        .skip(1)
    {
        // Label lines (`pid:  4242`) come first.
        let first = trace.lines().find(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| !w.ends_with(':'))
        });
        let Some(first) = first else {
            continue;
        };
        let mut words = first.split_whitespace();
        let (Some(value), Some(leaf)) = (words.next(), words.next()) else {
            continue;
        };
        *out.entry(leaf.to_string()).or_default() += parse_value(value);
    }
    out
}

/// `96MB`, `4MB`, `9.77kB`, `3072`: go tool pprof's units are powers of
/// 1024 for bytes.
fn parse_value(v: &str) -> u64 {
    let units = [
        ("GB", 1u64 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
        ("B", 1),
    ];
    for (suffix, scale) in units {
        if let Some(n) = v.strip_suffix(suffix) {
            let n: f64 = n.parse().unwrap_or_else(|_| panic!("value {v}"));
            return (n * scale as f64).round() as u64;
        }
    }
    v.parse().unwrap_or_else(|_| panic!("value {v}"))
}

pub(crate) fn snapshot_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            let named = p
                .file_stem()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with("heap-"));
            named && p.extension() == Some(OsStr::new("json"))
        })
        .collect();
    files.sort();
    files
}

#[test]
fn snapshot_on_peak_writes_the_burst_while_it_is_held() {
    let bin = compile_c("spike", "peak-snapshot", O2_FLAGS);
    let dir = open_dir("peak-snapshots");
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let template = dir.join("heap-{n}.json");
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "--snapshot-on-peak",
        "--format",
        "json",
        "-o",
        template.to_str().expect("utf-8 path"),
    ]);
    steps(&mut target, &["base", "burst"]);
    // The burst is held until the test says. A snapshot may catch it part
    // way; then another follows (within a second: the limit) unless the
    // whole heap is within 10 % of that one's. Either way a snapshot holds
    // at least this much of it:
    let enough = ((BASE + BURST) as f64 / 1.1) as u64 - BASE;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (path, report, held) = loop {
        let found = snapshot_files(&dir).into_iter().rev().find_map(|path| {
            let report = read_json(&path);
            let burst = per_site(&report).get("site_burst").copied()?;
            (burst[0] >= enough).then_some((path, report, burst))
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot shows the burst within 60 s: {:?}",
            snapshot_files(&dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        report["end_reason"]
            .as_str()
            .is_some_and(|r| r.contains("new high")),
        "{}: {}",
        path.display(),
        report["end_reason"]
    );
    // Written at a new high: what the burst holds now is what it held at
    // the peak.
    assert_eq!(at_peak(&report)["site_burst"], [held[0], held[1]]);
    steps(&mut target, &["free", "low"]);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    // The final report is the last numbered file, and still has the peak.
    let last = snapshot_files(&dir)
        .into_iter()
        .max_by_key(|p| {
            p.file_stem()
                .and_then(OsStr::to_str)
                .and_then(|s| s.strip_prefix("heap-")?.parse::<u32>().ok())
        })
        .expect("a final report");
    let last = read_json(&last);
    assert_eq!(last["end_reason"], "interrupted (SIGINT)");
    assert_eq!(at_peak(&last)["site_burst"], [BURST, BURST_BLOCKS]);
    assert_eq!(per_site(&last)["site_burst"][..2], [0, 0]);
    target.send("quit");
    target.wait_exit();
}
