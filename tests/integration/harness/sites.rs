//! tests/targets/sites.c: its builds, its exact per-site numbers, and
//! traces of it (or of any target) checked against them.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Finished, JsonTracer, Target, Tracer};

/// (in-use bytes, in-use objects, allocated bytes, allocated objects) per
/// thread for each site in tests/targets/sites.c.
pub const EXPECTED_PER_THREAD: &[(&str, [u64; 4])] = &[
    ("site_malloc", [10_000, 10, 10_000, 10]),
    ("site_calloc", [2_100, 7, 2_100, 7]),
    // 5 chains of realloc 16 -> 64 -> 256 -> 4096.
    (
        "site_realloc",
        [5 * 4096, 5, 5 * (16 + 64 + 256 + 4096), 20],
    ),
    ("site_reallocarray", [4 * 400, 4, 4 * 600, 8]),
    ("site_posix_memalign", [6 * 512, 6, 6 * 512, 6]),
    ("site_aligned_alloc", [3 * 1024, 3, 3 * 1024, 3]),
    ("site_memalign", [4 * 640, 4, 4 * 640, 4]),
    ("site_valloc", [2 * 5000, 2, 2 * 5000, 2]),
    ("site_realloc_zero", [0, 0, 3 * 300, 3]),
    ("site_churn", [0, 0, 20_000 * 48, 20_000]),
];

/// Both threads run every site.
pub const THREADS: u64 = 2;

/// Sums the JSON report's stacks by their leaf function.
pub fn per_site(report: &Value) -> BTreeMap<String, [u64; 4]> {
    per_site_by(report, |stack| {
        stack["frames"][0]["function"].as_str().map(str::to_string)
    })
}

/// Sums the stacks' [inuse bytes, inuse objects, alloc bytes, alloc
/// objects] by the name `key` gives each stack (stacks without one are
/// left out).
pub fn per_site_by(
    report: &Value,
    key: impl Fn(&Value) -> Option<String>,
) -> BTreeMap<String, [u64; 4]> {
    let mut sums = BTreeMap::new();
    for stack in report["stacks"].as_array().expect("stacks array") {
        let Some(name) = key(stack) else { continue };
        let e: &mut [u64; 4] = sums.entry(name).or_default();
        for (i, field) in [
            "inuse_bytes",
            "inuse_objects",
            "alloc_bytes",
            "alloc_objects",
        ]
        .iter()
        .enumerate()
        {
            e[i] += stack[field].as_u64().expect("count is a number");
        }
    }
    sums
}

pub fn assert_sites_exact(report: &Value) {
    let got = per_site(report);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS);
        assert_eq!(
            got.get(*site),
            Some(&want),
            "{site}: [inuse bytes, inuse objects, alloc bytes, alloc objects] differ; all sites: {got:#?}"
        );
    }
    assert_counters_zero(report, LOSSES);
}

/// The loss counters the sites tests require to be 0.
pub const LOSSES: &[&str] = &[
    "ringbuf_full",
    "live_map_full",
    "stack_lost",
    "inflight_full",
    "read_failed",
];

/// Attaches a JSON-writing tracer to `target`, runs its sites, stops the
/// tracer with `signal` and returns the report. `exact`: --sample-rate 1,
/// otherwise the tracer's default sampling.
pub fn trace_sites_to_json(
    target: &mut Target,
    tag: &str,
    exact: bool,
    signal: libc::c_int,
) -> Value {
    trace_sites_with(target, tag, exact, signal, &[]).0
}

/// `trace_sites_to_json` with `extra` tracer arguments; also returns how
/// the tracer ended (its stderr).
pub fn trace_sites_with(
    target: &mut Target,
    tag: &str,
    exact: bool,
    signal: libc::c_int,
    extra: &[&str],
) -> (Value, Finished) {
    let pid = target.pid().to_string();
    let args = [&["--pid", pid.as_str()], extra].concat();
    let tracer = if exact {
        JsonTracer::start(tag, &args)
    } else {
        JsonTracer::start_sampling(tag, &args)
    };
    target.run_sites();
    tracer.stop_with(signal)
}

/// The loss counters `keys` are all 0.
pub fn assert_counters_zero(report: &Value, keys: &[&str]) {
    let losses = &report["losses"];
    for key in keys {
        assert_eq!(losses[key], 0, "loss counter {key} in {losses}");
    }
}

/// The counters of `losses` that are not losses: frees of blocks the
/// trace never saw allocated and their bytes, and returns of calls begun
/// while the probes were being attached.
pub const NOT_LOSSES: [&str; 3] = [
    "unknown_frees",
    "unknown_free_bytes",
    "return_without_entry",
];

/// Every counter of data missing from the report is 0 (all but
/// `NOT_LOSSES`).
pub fn assert_no_losses(report: &Value) {
    for (key, value) in report["losses"].as_object().expect("losses") {
        if !NOT_LOSSES.contains(&key.as_str()) {
            assert_eq!(value, 0, "{key}: {}", report["losses"]);
        }
    }
}

/// Per-site sums keyed by the first `site_*` frame from the leaf: frames of
/// an interposed allocator (glibc's reallocarray calling jemalloc's
/// realloc), Rust's allocation shims and inlined std code may stand before
/// it. Rust symbol-table names lose their crate prefix (`rjem::site_x`).
pub fn per_calling_site(report: &Value) -> BTreeMap<String, [u64; 4]> {
    per_site_by(report, |stack| {
        stack["frames"]
            .as_array()?
            .iter()
            .filter_map(|f| f["function"].as_str())
            .map(|f| f.rsplit("::").next().unwrap_or(f))
            .find(|f| f.starts_with("site_"))
            .map(str::to_string)
    })
}

/// The report's "not freed at exit" section summed by leaf function:
/// [bytes, objects, processes].
pub fn at_exit_by_leaf(report: &Value) -> BTreeMap<String, [u64; 3]> {
    let mut out: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    let stacks = report["not_freed_at_exit"]["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("no not_freed_at_exit.stacks: {report}"));
    for s in stacks {
        let leaf = s["frames"][0]["function"].as_str().unwrap_or("[no stack]");
        let sum = out.entry(leaf.to_string()).or_default();
        for (i, field) in ["bytes", "objects", "processes"].iter().enumerate() {
            sum[i] += s[*field]
                .as_u64()
                .unwrap_or_else(|| panic!("{field} in {s}"));
        }
    }
    out
}

pub const FP_FLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-optimize-sibling-calls",
];

/// How distribution packages are built: no frame pointers.
pub const O2_FLAGS: &[&str] = &["-O2", "-g", "-fomit-frame-pointer"];

pub const O0_FLAGS: &[&str] = &["-O0", "-g"];

/// Reports of one run of a target, from three tracers attached at once
/// (JSON, collapsed, text), all stopped with SIGINT.
pub struct Reports {
    pub json: Value,
    pub collapsed: String,
    pub collapsed_stderr: String,
    pub text: String,
}

/// Starts `bin` with `target_args`, attaches three tracers with
/// `tracer_args` (JSON to a scratch file named after `tag`, collapsed, text),
/// runs the target's allocations (the ready/go/done protocol of
/// tests/targets/sites.c), then stops the tracers with SIGINT.
pub fn trace_formats(
    bin: &std::path::Path,
    target_args: &[&str],
    tag: &str,
    tracer_args: &[&str],
) -> Reports {
    let mut target = Target::start(bin, target_args);
    let pid = target.pid().to_string();
    let with = |more: &[&'static str]| [&["--pid", pid.as_str()], tracer_args, more].concat();
    let json = JsonTracer::start(tag, &with(&[]));
    let collapsed = Tracer::start(&with(&["--format", "collapsed"]));
    let text = Tracer::start(&with(&["--format", "text", "--top", "50"]));
    target.run_sites();
    let (json, _) = json.stop();
    let mut outputs = Vec::new();
    for tracer in [collapsed, text] {
        tracer.signal(libc::SIGINT);
        let out = tracer.finish();
        assert!(out.status.success(), "tracer failed: {}", out.stderr);
        outputs.push(out);
    }
    let text = outputs.pop().expect("text output").stdout;
    let collapsed = outputs.pop().expect("collapsed output");
    Reports {
        json,
        collapsed: collapsed.stdout,
        collapsed_stderr: collapsed.stderr,
        text,
    }
}

/// Every site's stack is complete: through run_sites to main (main thread)
/// or to the thread's start routine `worker`, and not marked truncated.
pub fn assert_site_stacks_complete(report: &Value) {
    for stack in report["stacks"].as_array().expect("stacks") {
        let names: Vec<&str> = stack["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f["function"].as_str().unwrap_or(""))
            .collect();
        if !names.first().is_some_and(|n| n.starts_with("site_")) {
            continue;
        }
        assert_eq!(names.get(1), Some(&"run_sites"), "{names:?}");
        assert!(names[2] == "main" || names[2] == "worker", "{names:?}");
        assert_eq!(stack["truncated"], false, "{names:?}");
    }
}
