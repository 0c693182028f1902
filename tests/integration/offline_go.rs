//! A Go program's own heap profiles (runtime/pprof): `report` names Go's
//! sample types and functions, `diff` gives the growth between two, run as
//! `nobody`.

use std::{ffi::OsStr, path::Path, process::Command};

use crate::harness::{
    offline::{as_nobody, collapsed_by_leaf, ok, open_dir, share},
    pprof::go,
    scratch,
};

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
