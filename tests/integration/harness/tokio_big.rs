//! tests/targets/tokio_big: the tokio program whose tasks are futures of
//! more than 32 KiB, built once per test process, and its exact numbers.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use super::toolchain_binary;

/// Tasks the program spawns (TASKS in its main.rs).
pub const TASKS: u64 = 8;

/// (in-use bytes, in-use objects, allocated bytes, allocated objects) for
/// each site of tests/targets/tokio_big/src/main.rs, all tasks together.
pub const EXPECTED: &[(&str, [u64; 4])] = &[
    // Task t keeps 10 x malloc(3000 + t).
    (
        "site_task_keep",
        [10 * (8 * 3000 + 28), 80, 10 * (8 * 3000 + 28), 80],
    ),
    // 1000 x malloc(48) per task, each freed at once.
    ("site_task_churn", [0, 0, 8 * 1000 * 48, 8000]),
    // One malloc(777) per task, from a task spawned on a worker thread.
    ("site_nested_keep", [8 * 777, 8, 8 * 777, 8]),
];

/// Builds tests/targets/tokio_big (release, offline: tokio is the
/// workspace's locked version, in the cargo cache) once per test process
/// into CARGO_TARGET_TMPDIR/tokio_big-target. About 20 s the first time on
/// this 2-core machine, 2 s when only main.rs changed. Concurrent test
/// processes wait on cargo's own lock of that directory.
pub fn tokio_big_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/targets/tokio_big/Cargo.toml");
        let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tokio_big-target");
        let status = Command::new(toolchain_binary("cargo"))
            .args([
                "build",
                "--release",
                "--offline",
                "--locked",
                "--manifest-path",
            ])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target_dir)
            // No frame pointers, whatever the environment asks for.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .expect("run cargo");
        assert!(
            status.success(),
            "building {} failed (offline: tokio must be in the cargo cache, as the workspace's \
             Cargo.lock has it)",
            manifest.display()
        );
        target_dir.join("release/tokio_big")
    })
}
