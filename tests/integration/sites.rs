//! Exact per-call-site numbers for every hooked glibc function.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::harness::{compile_c, root_or_skip, scratch, Target, Tracer};

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
const THREADS: u64 = 2;

/// Sums the JSON report's stacks by their leaf function.
pub fn per_site(report: &Value) -> BTreeMap<String, [u64; 4]> {
    let mut sums = BTreeMap::new();
    for stack in report["stacks"].as_array().expect("stacks array") {
        let leaf = stack["frames"][0]["function"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let e: &mut [u64; 4] = sums.entry(leaf).or_default();
        for (i, key) in [
            "inuse_bytes",
            "inuse_objects",
            "alloc_bytes",
            "alloc_objects",
        ]
        .iter()
        .enumerate()
        {
            e[i] += stack[key].as_u64().expect("count is a number");
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
    let losses = &report["losses"];
    for key in [
        "ringbuf_full",
        "live_map_full",
        "stack_lost",
        "inflight_full",
        "read_failed",
    ] {
        assert_eq!(losses[key], 0, "loss counter {key} in {losses}");
    }
}

pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read report {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{text}"))
}

pub const FP_FLAGS: &[&str] = &[
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-optimize-sibling-calls",
];

/// Three tracers on one run of the target: JSON, collapsed and text, all
/// stopped with SIGINT.
#[test]
fn every_hooked_function_reports_exact_numbers_per_call_site() {
    if !root_or_skip("every_hooked_function_reports_exact_numbers_per_call_site") {
        return;
    }
    let bin = compile_c("sites", "fp", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let json_path = scratch("sites-fp.json");
    let json = Tracer::start(&[
        "--pid",
        &pid,
        "--format",
        "json",
        "-o",
        json_path.to_str().expect("utf-8 path"),
    ]);
    let collapsed = Tracer::start(&["--pid", &pid, "--format", "collapsed"]);
    let text = Tracer::start(&["--pid", &pid, "--top", "50"]);
    target.run_sites();
    let mut outputs = Vec::new();
    for tracer in [json, collapsed, text] {
        tracer.signal(libc::SIGINT);
        let out = tracer.finish();
        assert!(out.status.success(), "tracer failed: {}", out.stderr);
        outputs.push(out);
    }

    let report = read_json(&json_path);
    assert_sites_exact(&report);
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    assert_eq!(report["sample_rate"], 1);

    // Collapsed: root first, in-use bytes; the main thread's chain for every
    // site that keeps memory, with the main thread's exact bytes.
    let lines = &outputs[1].stdout;
    for (site, [inuse, ..]) in EXPECTED_PER_THREAD {
        let chain = format!("main;run_sites;{site} {inuse}");
        if *inuse > 0 {
            assert!(
                lines.lines().any(|l| l.ends_with(&chain)),
                "no collapsed line ending in {chain:?}:\n{lines}"
            );
        } else {
            assert!(
                !lines.contains(&format!(";{site} ")),
                "{site} keeps nothing:\n{lines}"
            );
        }
    }
    assert!(
        outputs[1].stderr.contains("Losses"),
        "loss counters on stderr: {}",
        outputs[1].stderr
    );

    let text = &outputs[2].stdout;
    for needle in ["site_realloc", "run_sites", "main", "Losses", "sites.c"] {
        assert!(
            text.contains(needle),
            "text report lacks {needle:?}:\n{text}"
        );
    }
}
