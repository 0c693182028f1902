//! Saved profiles: `report FILE` and `diff OLD NEW`, run as an unprivileged
//! user (`nobody`) on snapshots of a real trace: the diff gives the leak's
//! growth exactly in exact mode, and `report` re-renders a saved JSON with
//! the numbers of the original; pprof files (ours) diff against JSON ones.
//! Go's own heap profiles: offline_go.rs; bad files: offline_errors.rs.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    offline::{as_nobody, collapsed_by_leaf, ok, open_dir, share},
    pprof::go,
    read_json, scratch,
    sites::{per_site, O2_FLAGS},
    Target, Tracer,
};

/// What each "l" step of leak_steps.c leaks from leaky().
const LEAK_PER_STEP: u64 = 25 * 1000;

fn snapshot_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("heap-{n}.json"))
}

fn newest(dir: &Path) -> u32 {
    (1..)
        .take_while(|&n| snapshot_path(dir, n).exists())
        .last()
        .unwrap_or(0)
}

/// Runs `steps` "l" steps, then returns the number of the first snapshot
/// begun after they were done (the one after any snapshot under way).
fn steps_then_snapshot(target: &mut Target, steps: usize, dir: &Path) -> u32 {
    for _ in 0..steps {
        target.send("l");
        target.wait_for("did l");
    }
    let n = newest(dir) + 2;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !snapshot_path(dir, n).exists() {
        assert!(Instant::now() < deadline, "no snapshot {n} within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    n
}

/// Traces leak_steps.c in exact mode with snapshots; returns the
/// directory and the snapshots taken after 1 and after 3 steps.
fn two_snapshots(tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let bin = compile_c("leak_steps", tag, O2_FLAGS);
    let dir = open_dir(tag);
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
    let first = steps_then_snapshot(&mut target, 1, &dir);
    let second = steps_then_snapshot(&mut target, 2, &dir);
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    target.send("quit");
    target.wait_exit();
    share(&dir);
    (
        dir.clone(),
        snapshot_path(&dir, first),
        snapshot_path(&dir, second),
    )
}

/// `go tool pprof -raw FILE`: each sample's values (alloc objects, alloc
/// space, inuse objects, inuse space, signed) summed by leaf function.
fn pprof_raw_by_leaf(file: &Path) -> BTreeMap<String, [i64; 4]> {
    let out = Command::new(go())
        .args(["tool", "pprof", "-raw"])
        .arg(file)
        .env("PPROF_TMPDIR", scratch("pprof-tmp"))
        .env("PPROF_BINARY_PATH", "/nonexistent")
        .output()
        .expect("run go tool pprof");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof -raw failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (samples, rest) = raw
        .split_once("\nSamples:\n")
        .and_then(|(_, s)| s.split_once("\nLocations\n"))
        .unwrap_or_else(|| panic!("no Samples / Locations in:\n{raw}"));
    // `ID: 0xADDR M=N function file:line s=0`: the first function of each.
    let mut names = BTreeMap::new();
    for line in rest.split("\nMappings\n").next().unwrap_or(rest).lines() {
        let Some((id, rest)) = line.split_once(": 0x") else {
            continue;
        };
        let rest = rest.split_once(' ').map_or("", |(_, r)| r);
        let rest = rest
            .strip_prefix("M=")
            .map_or(rest, |r| r.split_once(' ').map_or("", |(_, r)| r));
        let rest = rest.rsplit_once(" s=").map_or(rest, |(t, _)| t);
        let name = rest.rsplit_once(' ').map_or(rest, |(f, _)| f);
        names.insert(id.trim().to_string(), name.to_string());
    }
    let mut out: BTreeMap<String, [i64; 4]> = BTreeMap::new();
    for line in samples.lines().skip(1) {
        let Some((values, ids)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = values
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<Vec<i64>, _>>()
        else {
            continue; // a label line
        };
        let leaf = ids.split_whitespace().next().expect("a location");
        let e = out.entry(names[leaf].clone()).or_default();
        for (sum, v) in e.iter_mut().zip(v) {
            *sum += v;
        }
    }
    out
}

#[test]
fn diff_of_two_snapshots_gives_the_leak_exactly_as_nobody() {
    let (dir, old, new) = two_snapshots("offline-diff");
    let growth = 2 * LEAK_PER_STEP as i64;
    diff_collapsed_and_text(&old, &new, growth);
    diff_pprof_both_ways(&dir, &old, &new, growth);
    diff_json_and_flamegraph(&dir, &old, &new, growth);
}

/// `diff` as collapsed stacks and as text.
fn diff_collapsed_and_text(old: &Path, new: &Path, growth: i64) {
    // Collapsed: signed, the leak's growth exactly; churn keeps nothing.
    let collapsed = ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("collapsed"),
    ]));
    let by_leaf = collapsed_by_leaf(&collapsed);
    assert_eq!(by_leaf.get("leaky"), Some(&growth), "{collapsed}");
    assert_eq!(by_leaf.get("churn"), None, "{collapsed}");
    // Allocated bytes: the churn of two steps too.
    let alloc = ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
        OsStr::new("--view"),
        OsStr::new("alloc-space"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&alloc).get("churn"),
        Some(&(2 * 10 * 3000)),
        "{alloc}"
    );
    // Text: ranked first, with old, new and change.
    let text = ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
    ]));
    let first = text
        .split("#1 ")
        .nth(1)
        .unwrap_or_else(|| panic!("no #1 in {text}"));
    assert!(
        first.starts_with(&format!(
            "change +{growth} bytes (old {LEAK_PER_STEP}, new {})",
            3 * LEAK_PER_STEP
        )),
        "{text}"
    );
    assert!(
        first.lines().nth(1).is_some_and(|l| l.trim() == "leaky"),
        "{text}"
    );
}

/// `diff -f pprof`, read by go tool pprof, both ways round.
fn diff_pprof_both_ways(dir: &Path, old: &Path, new: &Path, growth: i64) {
    // pprof: NEW − OLD, read by go tool pprof.
    let pb = dir.join("diff.pb.gz");
    ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    let raw = pprof_raw_by_leaf(&pb);
    assert_eq!(raw.get("leaky"), Some(&[50, growth, 50, growth]), "{raw:?}");
    // The other way round, the values are negative.
    ok(&as_nobody(&[
        OsStr::new("diff"),
        new.as_os_str(),
        old.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    assert_eq!(
        pprof_raw_by_leaf(&pb).get("leaky"),
        Some(&[-50, -growth, -50, -growth])
    );
}

/// `diff -f json` and `diff -f flamegraph`.
fn diff_json_and_flamegraph(dir: &Path, old: &Path, new: &Path, growth: i64) {
    // JSON document and flamegraph.
    let json: Value = serde_json::from_str(&ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("json"),
    ])))
    .expect("diff JSON");
    assert_eq!(json["format"], "memtrace-bpf-diff/1");
    assert_eq!(json["stacks"][0]["frames"][0], "leaky", "{json}");
    assert_eq!(json["stacks"][0]["change"]["inuse_bytes"], growth, "{json}");
    let svg = dir.join("diff.svg");
    ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("flamegraph"),
        OsStr::new("-o"),
        svg.as_os_str(),
    ]));
    let svg = std::fs::read_to_string(&svg).expect("svg");
    assert!(svg.contains("<svg") && svg.contains("leaky"), "{svg}");
}

#[test]
fn report_rerenders_a_saved_profile_and_pprof_diffs_against_json_as_nobody() {
    let (dir, old, new) = two_snapshots("offline-report");
    let original = read_json(&new);
    let sites = per_site(&original);
    assert_eq!(sites["leaky"][0], 3 * LEAK_PER_STEP, "{original}");
    // JSON again: the same stacks, frames and totals.
    let again = dir.join("again.json");
    ok(&as_nobody(&[
        OsStr::new("report"),
        new.as_os_str(),
        OsStr::new("--format"),
        OsStr::new("json"),
        OsStr::new("-o"),
        again.as_os_str(),
    ]));
    let again = read_json(&again);
    assert_eq!(again["stacks"], original["stacks"]);
    assert_eq!(again["totals"], original["totals"]);
    // Collapsed and text: the original's numbers.
    let collapsed = ok(&as_nobody(&[
        OsStr::new("report"),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&collapsed).get("leaky"),
        Some(&(3 * LEAK_PER_STEP as i64)),
        "{collapsed}"
    );
    let text = ok(&as_nobody(&[
        OsStr::new("report"),
        new.as_os_str(),
        OsStr::new("--top"),
        OsStr::new("1"),
    ]));
    assert!(
        text.contains(&format!("#1  {} bytes in 75 objects", 3 * LEAK_PER_STEP)),
        "{text}"
    );
    // pprof: read by go tool pprof with the same numbers...
    let pb = dir.join("new.pb.gz");
    ok(&as_nobody(&[
        OsStr::new("report"),
        new.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    let raw = pprof_raw_by_leaf(&pb);
    let [inuse, inuse_n, alloc, alloc_n] = sites["leaky"].map(|v| v as i64);
    assert_eq!(
        raw.get("leaky"),
        Some(&[alloc_n, alloc, inuse_n, inuse]),
        "{raw:?}"
    );
    // ...and diffed against the older JSON: the same growth.
    let mixed = ok(&as_nobody(&[
        OsStr::new("diff"),
        old.as_os_str(),
        pb.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&mixed).get("leaky"),
        Some(&(2 * LEAK_PER_STEP as i64)),
        "{mixed}"
    );
    // --sort growth needs history.
    let out = as_nobody(&[
        OsStr::new("report"),
        new.as_os_str(),
        OsStr::new("--sort"),
        OsStr::new("growth"),
    ]);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--interval"), "{err}");
    }
}
