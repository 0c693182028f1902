//! Running `report` and `diff` as the unprivileged user `nobody`.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use super::{scratch, TRACER};

/// A directory `nobody` can read and write in (outputs go there too).
pub(crate) fn open_dir(tag: &str) -> PathBuf {
    let dir = scratch(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// Makes every file in `dir` readable by `nobody`.
pub(crate) fn share(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
}

/// Runs memtrace-bpf ARGS as nobody, without capabilities.
pub(crate) fn as_nobody<A: AsRef<OsStr>>(args: &[A]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(TRACER)
        .args(args)
        .output()
        .expect("run setpriv (util-linux)")
}

/// stdout of a run that must succeed with nothing alarming on stderr.
pub(crate) fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "failed ({:?}): {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sums collapsed lines (signed) by their leaf frame.
pub(crate) fn collapsed_by_leaf(text: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let (stack, value) = line.rsplit_once(' ').expect("STACK VALUE");
        let leaf = stack.rsplit(';').next().expect("a frame").to_string();
        *out.entry(leaf).or_default() += value.parse::<i64>().expect("a number");
    }
    out
}
