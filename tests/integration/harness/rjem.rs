//! tests/targets/rjem: the Rust program with a static tikv-jemallocator,
//! built once, and its exact per-function numbers.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use super::toolchain_binary;

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
