//! The Debian package (`cargo xtask dist`, docs/packaging.md): built once,
//! unpacked with `dpkg -x` into a scratch root, and what it installs run or
//! read by the programs that will use it: the binary on a target under the
//! unit's capabilities, the unit's own command line system-wide with SIGTERM
//! at the end, the man pages by groff and man, the completions by their
//! shells, the unit by `systemd-analyze verify`, the whole by lintian, and
//! the maintainer scripts by dpkg under a booted systemd.
//!
//! The tests are grouped by what they read: the package and its files here,
//! the binary and the unit in `service`, the man pages, documents and
//! completions in `docs`, the maintainer scripts and lintian in `scripts`.

mod booted;
mod docs;
mod scripts;
mod service;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use crate::harness::{process::run_timeout, scratch, toolchain_binary};

/// Where dh_installsystemd puts units since Debian 12's merged /usr (and
/// where systemd looks on every system).
const UNIT: &str = "usr/lib/systemd/system/memtrace-bpf.service";
/// The continuous system-wide trace; UNIT is the agent.
const CONTINUOUS: &str = "usr/lib/systemd/system/memtrace-bpf-continuous.service";
const TRIGGERS: &str = "etc/memtrace-bpf/triggers";
const DEFAULTS: &str = "etc/default/memtrace-bpf";
const BIN: &str = "usr/bin/memtrace-bpf";
/// The build it needs (the dev binary the tests use, and the assets
/// example) takes minutes on two busy cores when it is not already done
/// (`cargo xtask test` runs `dist --dev` before the tests).
const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

struct Package {
    deb: PathBuf,
    /// Where `dpkg -x` unpacked it.
    root: PathBuf,
}

/// `cargo xtask dist --dev` (the release package's files, from the dev
/// build), once for all the tests here, unpacked.
fn package() -> &'static Package {
    static PACKAGE: OnceLock<Package> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = run_timeout(
            Command::new(toolchain_binary("cargo"))
                .current_dir(&repo)
                .args(["xtask", "dist", "--dev"]),
            BUILD_TIMEOUT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cargo xtask dist failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let deb = PathBuf::from(stdout.lines().last().expect("the .deb's path, last"));
        assert!(deb.is_file(), "no package at {}", deb.display());
        let root = scratch("dist-root");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("scratch root");
        checked(Command::new("dpkg").arg("-x").arg(&deb).arg(&root));
        Package { deb, root }
    })
}

/// Runs `cmd`, asserts it succeeded, returns its stdout.
fn checked(cmd: &mut Command) -> String {
    let out = run_timeout(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_package_has_its_control_fields_conffile_and_files() {
    let p = package();
    let field = |name: &str| checked(Command::new("dpkg-deb").arg("-f").arg(&p.deb).arg(name));
    assert_eq!(field("Package").trim(), "memtrace-bpf");
    assert_eq!(field("Version").trim(), env!("CARGO_PKG_VERSION"));
    assert_eq!(field("Architecture").trim(), "amd64");
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "Depends: {depends}");
    let control = scratch("dist-control");
    let _ = std::fs::remove_dir_all(&control);
    checked(Command::new("dpkg-deb").arg("-e").arg(&p.deb).arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles,
        "/etc/default/memtrace-bpf\n/etc/memtrace-bpf/triggers\n"
    );
    let listing = checked(Command::new("dpkg-deb").arg("-c").arg(&p.deb));
    for path in [
        BIN,
        UNIT,
        CONTINUOUS,
        DEFAULTS,
        TRIGGERS,
        "usr/share/man/man1/memtrace-bpf.1.gz",
        "usr/share/man/man1/memtrace-bpf-report.1.gz",
        "usr/share/man/man1/memtrace-bpf-diff.1.gz",
        "usr/share/bash-completion/completions/memtrace-bpf",
        "usr/share/zsh/vendor-completions/_memtrace-bpf",
        "usr/share/fish/vendor_completions.d/memtrace-bpf.fish",
        "usr/share/doc/memtrace-bpf/copyright",
        "usr/share/doc/memtrace-bpf/changelog.gz",
        "usr/share/doc/memtrace-bpf/packaging.md",
    ] {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!("./{path}")))
            .unwrap_or_else(|| panic!("{path} not in the package:\n{listing}"));
        // Owned by root (cargo-deb writes the ids without names).
        let owner = line.split_whitespace().nth(1);
        assert!(matches!(owner, Some("0/0" | "root/root")), "{line}");
        let mode = if path == BIN {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert!(line.starts_with(mode), "{line}");
    }
}
