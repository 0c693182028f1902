//! The maintainer scripts, run by dpkg in a scratch root (enable links,
//! masks, the state directory) and under a booted systemd (`booted`), and
//! lintian's verdict on the package.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{checked, package, BIN, DEFAULTS};
use crate::harness::{process::run_timeout, scratch};

/// The link `systemctl enable` makes for the unit's `WantedBy=`.
const WANTS: &str = "etc/systemd/system/multi-user.target.wants/memtrace-bpf.service";
/// The link deb-systemd-helper makes to mask the unit while it is removed.
const MASK: &str = "etc/systemd/system/memtrace-bpf.service";
const STATE: &str = "var/lib/memtrace-bpf";

#[test]
fn dpkg_installs_it_keeps_the_conffile_on_remove_and_drops_it_on_purge() {
    let p = package();
    let root = empty_dpkg_root();
    let deb = p.deb.to_str().expect("utf-8 path");
    let dpkg = |args: &[&str]| {
        checked(
            Command::new("dpkg")
                .arg(format!("--root={}", root.display()))
                .args(["--force-depends", "--force-script-chrootless"])
                .args(args),
        )
    };
    let is_enabled = || {
        let out = run_timeout(
            Command::new("systemctl")
                .arg(format!("--root={}", root.display()))
                .args(["is-enabled", "memtrace-bpf.service"]),
            Duration::from_secs(60),
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    dpkg(&["-i", deb]);
    let status = checked(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["-s", "memtrace-bpf"]),
    );
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(
        status.contains("Conffiles:\n /etc/default/memtrace-bpf "),
        "{status}"
    );
    assert!(root.join(BIN).is_file());
    assert_eq!(is_enabled(), "disabled", "not enabled on install");

    // The administrator enables it (systemctl --root works offline), and
    // the service has written its report in its state directory.
    checked(
        Command::new("systemctl")
            .arg(format!("--root={}", root.display()))
            .args(["enable", "memtrace-bpf.service"]),
    );
    assert!(root.join(WANTS).is_symlink());
    std::fs::create_dir_all(root.join(STATE)).expect("state directory");
    std::fs::write(root.join(STATE).join("heap.json"), "{}").expect("a report");

    dpkg(&["-r", "memtrace-bpf"]);
    assert!(!root.join(BIN).exists(), "remove removes the binary");
    assert!(root.join(DEFAULTS).is_file(), "remove keeps the conffile");
    // The enable link is the administrator's choice and stays with the
    // conffile; masked, it starts nothing while the unit is gone.
    assert_eq!(
        std::fs::read_link(root.join(MASK)).ok().as_deref(),
        Some(Path::new("/dev/null")),
        "remove masks the unit"
    );
    assert_eq!(is_enabled(), "masked");
    assert!(
        root.join(STATE).join("heap.json").is_file(),
        "remove keeps the report"
    );

    // Installed again, the choice is back in force.
    dpkg(&["-i", deb]);
    assert!(!root.join(MASK).is_symlink(), "install unmasks");
    assert_eq!(is_enabled(), "enabled", "enabled again as it was");

    dpkg(&["-r", "memtrace-bpf"]);
    dpkg(&["--purge", "memtrace-bpf"]);
    assert!(!root.join(DEFAULTS).exists(), "purge removes the conffile");
    assert!(!root.join(STATE).exists(), "purge removes {STATE}");
    let left = files_under(&root.join("etc/systemd"))
        .into_iter()
        .chain(files_under(&root.join("var/lib/systemd")))
        .filter(|f| f.to_string_lossy().contains("memtrace"))
        .collect::<Vec<_>>();
    assert!(left.is_empty(), "purge leaves {left:?}");
    assert_eq!(is_enabled(), "", "purge leaves no trace of the unit");

    // This machine (where the binary ran) meets every Depends.
    assert_this_machine_meets_every_depends(&p.deb);
}

/// A scratch root with an empty dpkg database.
fn empty_dpkg_root() -> PathBuf {
    // An empty dpkg database in a scratch root: dpkg --root installs there
    // (the root has no libc6 package, hence --force-depends; the host's
    // versions are checked against Depends after the purge). The scripts run outside
    // it with DPKG_ROOT set, which deb-systemd-helper and postrm honour.
    let root = scratch("dist-dpkg-root");
    let _ = std::fs::remove_dir_all(&root);
    let db = root.join("var/lib/dpkg");
    for dir in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(db.join(dir)).expect("dpkg database dirs");
    }
    std::fs::write(db.join("status"), "").expect("status");
    root
}

/// Each package in the Depends of `deb` is installed here at the version
/// it asks for or later.
fn assert_this_machine_meets_every_depends(deb: &Path) {
    let depends = checked(Command::new("dpkg-deb").arg("-f").arg(deb).arg("Depends"));
    for dep in depends.trim().split(", ") {
        let (name, rest) = dep.split_once(" (>= ").expect("NAME (>= VERSION)");
        let wanted = rest.strip_suffix(')').expect("closing parenthesis");
        let installed = checked(Command::new("dpkg-query").args(["-W", "-f=${Version}", name]));
        checked(Command::new("dpkg").args(["--compare-versions", &installed, "ge", wanted]));
    }
}

/// Every path under `dir` (links included, not followed).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(files_under(&path));
        }
        found.push(path);
    }
    found
}

/// lintian, Debian's package checker, finds no error; its warnings and
/// notes are printed for the record.
#[test]
fn lintian_finds_no_errors() {
    let p = package();
    let out = run_timeout(
        Command::new("lintian")
            .args(["--no-tag-display-limit", "--display-level", ">=pedantic"])
            .arg(&p.deb),
        Duration::from_secs(20 * 60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Tags are printed as `E: memtrace-bpf: TAG [context]`, E for errors.
    let errors: Vec<&str> = text.lines().filter(|l| l.starts_with("E: ")).collect();
    assert!(
        errors.is_empty(),
        "lintian errors:\n{}\n\nall of it:\n{text}",
        errors.join("\n")
    );
    // Exit status 1 is errors; 2 is lintian failing to check at all.
    assert!(
        out.status.success(),
        "lintian ({}): {text}\n{stderr}",
        out.status
    );
    eprintln!("lintian on {}:\n{text}", p.deb.display());
}
