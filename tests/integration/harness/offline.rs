//! Running `report` and `diff` as the unprivileged user `nobody`.

use std::{
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
