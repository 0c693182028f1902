//! A Rust program whose `#[global_allocator]` is tikv-jemallocator
//! (tests/targets/rjem): jemalloc linked statically into the executable
//! under prefixed names (`_rjem_malloc`, ...), called by no shared library.
//! The tracer hooks those functions in the executable itself and gives
//! exact per-function numbers.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::{
    harness::{toolchain_binary, Target},
    sites::{assert_counters_zero, per_calling_site, trace_sites_to_json, LOSSES},
};

/// (in-use bytes, in-use objects, allocated bytes, allocated objects) per
/// thread for each function of tests/targets/rjem/src/main.rs: requested
/// sizes (for a realloc the new size), not jemalloc's size classes.
pub const EXPECTED_PER_THREAD: &[(&str, [u64; 4])] = &[
    // 10 x malloc(1000).
    ("site_malloc", [10_000, 10, 10_000, 10]),
    // 7 x calloc(1, 300).
    ("site_calloc", [2_100, 7, 2_100, 7]),
    // 5 chains of malloc(16), realloc to 64, 256, 4096.
    (
        "site_realloc",
        [5 * 4096, 5, 5 * (16 + 64 + 256 + 4096), 20],
    ),
    // 3 x mallocx(5000, MALLOCX_LG_ALIGN(12)).
    ("site_mallocx_page", [3 * 5000, 3, 3 * 5000, 3]),
    // 4 x mallocx(64, MALLOCX_LG_ALIGN(6)).
    ("site_mallocx_line", [4 * 64, 4, 4 * 64, 4]),
    // 6 x mallocx(8, MALLOCX_LG_ALIGN(4)).
    ("site_mallocx_small", [6 * 8, 6, 6 * 8, 6]),
    // 4 x mallocx(2048, MALLOCX_LG_ALIGN(6) | MALLOCX_ZERO).
    ("site_mallocx_zero", [4 * 2048, 4, 4 * 2048, 4]),
    // 3 chains of mallocx(128, 6), rallocx to 512, 2048, then 1024.
    (
        "site_rallocx",
        [3 * 1024, 3, 3 * (128 + 512 + 2048 + 1024), 12],
    ),
    // 10 x malloc(700), 5 of them freed with sdallocx(p, 700, 0).
    ("site_partial", [5 * 700, 5, 10 * 700, 10]),
    // 20000 x malloc(48) + sdallocx(p, 48, 0).
    ("site_churn", [0, 0, 20_000 * 48, 20_000]),
    // 1000 x mallocx(256, 12) + sdallocx(p, 256, 12).
    ("site_churn_aligned", [0, 0, 1000 * 256, 1000]),
];

/// The main thread and one worker run every function.
const THREADS: u64 = 2;

/// Every jemalloc entry point tikv-jemallocator's GlobalAlloc calls (and
/// the program reaches); `_rjem_free` is never called (dealloc is sdallocx).
const ENTRY_POINTS: &[&str] = &[
    "_rjem_malloc",
    "_rjem_calloc",
    "_rjem_realloc",
    "_rjem_mallocx",
    "_rjem_rallocx",
    "_rjem_sdallocx",
];

/// Builds tests/targets/rjem (release) once per test process into
/// TARGET_DIR/rjem; jemalloc's C build takes about a minute the first time.
/// Concurrent test processes wait on cargo's own lock of that directory.
pub fn rjem_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/rjem/Cargo.toml");
        let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .expect("CARGO_TARGET_TMPDIR is TARGET_DIR/tmp")
            .join("rjem");
        let status = Command::new(toolchain_binary("cargo"))
            .args(["build", "--release", "--locked", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir)
            .status()
            .expect("run cargo");
        assert!(status.success(), "building {} failed", manifest.display());
        target_dir.join("release/rjem")
    })
}

#[test]
fn a_static_tikv_jemallocator_is_hooked_in_the_executable_with_exact_numbers() {
    let bin = rjem_binary();
    let mut target = Target::start(bin, &[]);
    let report = trace_sites_to_json(&mut target, "rjem", true, libc::SIGINT);

    let exe = std::fs::canonicalize(bin).expect("rjem binary path");
    let hooks = report["hooks"].as_array().expect("hooks");
    for name in ENTRY_POINTS {
        let hook = hooks
            .iter()
            .find(|h| {
                h["function"] == *name && Path::new(h["module"].as_str().unwrap_or("")) == exe
            })
            .unwrap_or_else(|| panic!("no hook of {name} in {}: {hooks:#?}", exe.display()));
        assert!(
            hook["status"]
                .as_str()
                .is_some_and(|s| s.starts_with("attached")),
            "{hook}"
        );
    }

    let got = per_calling_site(&report);
    for (function, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS);
        assert_eq!(
            got.get(*function),
            Some(&want),
            "{function}: [inuse bytes, inuse objects, alloc bytes, alloc objects] differ; all: {got:#?}"
        );
    }
    let names: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = EXPECTED_PER_THREAD.iter().map(|(f, _)| *f).collect();
    assert_eq!(names, expected, "functions seen: {got:#?}");

    assert_counters_zero(&report, LOSSES);
}
