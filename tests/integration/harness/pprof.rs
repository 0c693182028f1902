//! `go tool pprof`, the real consumer of `--format pprof`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::scratch;

/// `go`, which the tests need: missing is a failure, not a skip.
pub(crate) fn go() -> PathBuf {
    let found = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/lib/go/bin")])
        .map(|dir| dir.join("go"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("`go` not found (for `go tool pprof`): run `cargo xtask setup` (Debian's golang-go)")
    })
}

/// `go tool pprof ARGS FILE`'s stdout, asserting that it succeeded.
pub(crate) fn pprof(args: &[&str], file: &Path) -> String {
    let out = Command::new(go())
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // No symbolization attempts, no browser, no writes to $HOME.
        .env("PPROF_TMPDIR", scratch("pprof-tmp"))
        .env("PPROF_BINARY_PATH", "/nonexistent")
        .output()
        .expect("run go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof {args:?} {} failed: {}\n{stdout}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
