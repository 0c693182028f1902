//! Saved profiles: `report FILE` and `diff OLD NEW`, run as an unprivileged
//! user (`nobody`) on snapshots of a real trace: the diff gives the leak's
//! growth exactly in exact mode, `report` re-renders a saved JSON with the
//! numbers of the original, pprof files (ours) diff against JSON ones, and
//! bad files give clear errors.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    offline::{as_nobody, open_dir, share},
    read_json, scratch,
    sites::{per_site, O2_FLAGS},
    Target, Tracer, TRACER,
};

/// What each "l" step of leak_steps.c leaks from leaky().
const LEAK_PER_STEP: u64 = 25 * 1000;

/// stdout of a run that must succeed with nothing alarming on stderr.
fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?}): {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

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

/// Sums collapsed lines (signed) by their leaf frame.
fn collapsed_by_leaf(text: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let (stack, value) = line.rsplit_once(' ').expect("STACK VALUE");
        let leaf = stack.rsplit(';').next().expect("a frame").to_string();
        *out.entry(leaf).or_default() += value.parse::<i64>().expect("a number");
    }
    out
}

/// `go`, as tests/integration/pprof.rs finds it.
fn go() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/lib/go/bin")])
        .map(|dir| dir.join("go"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`go` not found: run `cargo xtask setup` (Debian's golang-go)"))
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

/// Runs memtrace-bpf ARGS as nobody and returns stderr, asserting failure.
fn fails(args: &[&OsStr]) -> String {
    let out = as_nobody(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.starts_with("memtrace-bpf: error: ") && !err.contains("panicked"),
        "{err}"
    );
    err
}

#[test]
fn bad_saved_files_give_clear_errors_as_nobody() {
    let dir = open_dir("offline-bad");
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    // A valid profile whose function name holds a terminal escape.
    let good = write(
        "good.json",
        br#"{"format":"memtrace-bpf/2","target":"t","totals":{"inuse_bytes":5},
            "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
            "frames":[{"function":"evil\u001b[2J","module":"/bin/x"}]}"#,
    );
    let text = ok(&as_nobody(&[OsStr::new("report"), good.as_os_str()]));
    assert!(
        text.contains("evil\\x1b[2J") && !text.contains('\u{1b}'),
        "{text}"
    );
    let pb = dir.join("good.pb.gz");
    ok(&as_nobody(&[
        OsStr::new("report"),
        good.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    let gz = std::fs::read(&pb).expect("pprof");
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "malformed.json",
            b"{\"format\": \"memtrace-bpf/2\", \"stacks\": [".to_vec(),
            "malformed",
        ),
        (
            "future.json",
            br#"{"format":"memtrace-bpf/3","stacks":[]}"#.to_vec(),
            "memtrace-bpf/3",
        ),
        (
            "range.json",
            br#"{"format":"memtrace-bpf/2","stacks":[{"frames":[7]}],"frames":[]}"#.to_vec(),
            "frame index 7 is out of range",
        ),
        ("cut.pb.gz", gz[..gz.len() / 2].to_vec(), "gzip"),
        ("noise.bin", vec![0xff; 64], "malformed"),
        ("empty.json", Vec::new(), "it is empty (0 bytes)"),
    ];
    for (name, bytes, says) in cases {
        let path = write(name, &bytes);
        let err = fails(&[OsStr::new("report"), path.as_os_str()]);
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
        let err = fails(&[OsStr::new("diff"), good.as_os_str(), path.as_os_str()]);
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
    }
    let err = fails(&[OsStr::new("report"), dir.join("missing.json").as_os_str()]);
    assert!(
        err.contains("missing.json") && err.contains("cannot open"),
        "{err}"
    );
    let err = fails(&[
        OsStr::new("report"),
        good.as_os_str(),
        OsStr::new("--sort"),
        OsStr::new("growth"),
    ]);
    assert!(
        err.contains("no history") && err.contains("--interval"),
        "{err}"
    );
}

#[test]
fn a_go_heap_profile_reports_and_diffs_as_nobody() {
    let dir = open_dir("offline-go");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/goheap.go");
    let bin = dir.join("goheap");
    let built = Command::new(go())
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .env("GOCACHE", scratch("go-cache"))
        .output()
        .expect("run go build");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let ran = Command::new(&bin)
        .arg(&dir)
        .output()
        .expect("run the Go target");
    assert!(
        ran.status.success(),
        "goheap: {}",
        String::from_utf8_lossy(&ran.stderr)
    );
    share(&dir);
    let (h1, h2) = (dir.join("h1.pb.gz"), dir.join("h2.pb.gz"));
    // Go's sample types by name; functions from its locations.
    let collapsed = ok(&as_nobody(&[
        OsStr::new("report"),
        h2.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&collapsed).get("main.leak"),
        Some(&(400 * 4096)),
        "{collapsed}"
    );
    let diff = ok(&as_nobody(&[
        OsStr::new("diff"),
        h1.as_os_str(),
        h2.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&diff).get("main.leak"),
        Some(&(300 * 4096)),
        "{diff}"
    );
    let objects = ok(&as_nobody(&[
        OsStr::new("diff"),
        h1.as_os_str(),
        h2.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("collapsed"),
        OsStr::new("--view"),
        OsStr::new("inuse-objects"),
    ]));
    assert_eq!(
        collapsed_by_leaf(&objects).get("main.leak"),
        Some(&300),
        "{objects}"
    );
}

#[test]
fn bad_command_lines_of_report_and_diff_exit_with_status_2() {
    for args in [
        &["diff", "only-one.json"][..],
        &["report", "x.json", "--top", "0"],
        &["report", "x.json", "--format", "nonsense"],
    ] {
        let out = Command::new(TRACER).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}
