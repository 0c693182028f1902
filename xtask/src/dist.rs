//! `cargo xtask dist`: target/dist/memtrace-bpf_VERSION_amd64.deb, built
//! by cargo-deb from `[package.metadata.deb]` in tracer/Cargo.toml:
//!
//! - the release binary (the BPF object is inside it: tracer/build.rs
//!   builds it and probes/loader.rs embeds it with `include_bytes_aligned!`),
//!   stripped as Debian ships binaries (the BPF object is data in .rodata
//!   and stays);
//! - man pages and bash, zsh and fish completions generated from the clap
//!   definition by tracer/examples/dist_assets.rs;
//! - docs/*.md in /usr/share/doc/memtrace-bpf, where --help's and the man
//!   pages' docs/NAME.md pointers lead, with dist/copyright and
//!   dist/changelog (a native package's changelog.gz);
//! - dist/memtrace-bpf.service (the agent, docs/agent.md),
//!   dist/memtrace-bpf-continuous.service (a system-wide sampled trace
//!   served on 127.0.0.1:6060), dist/memtrace-bpf.triggers installed as
//!   /etc/memtrace-bpf/triggers, and dist/memtrace-bpf.default, installed as
//!   /etc/default/memtrace-bpf, both marked conffiles (dpkg keeps the
//!   administrator's edits across upgrades);
//! - maintainer scripts: dh_installsystemd's fragments (the unit is not
//!   enabled or started on install, is stopped on remove, restarted on
//!   upgrade if it ran; its enable links go on purge) and
//!   dist/debian/postrm, which removes /var/lib/memtrace-bpf on purge.
//!
//! `Depends:` comes from dpkg-shlibdeps (the libc6 and libgcc-s1 versions
//! the binary's symbol versions need); `Version:` is memtrace-bpf's version
//! in Cargo.toml, without a Debian revision. The last line on stdout is the
//! package's path.
//!
//! `--dev` packages the dev-profile binary into target/dist-dev instead:
//! the same package from the build the tests already make (the package
//! test and `cargo xtask test` use it; the release build takes 5-12
//! minutes more on two cores). cargo-deb 3.8 warns that it may refuse the
//! dev profile in a future release; its version is pinned in setup.rs.

use std::{fs, path::Path, process::Command, time::Instant};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, describe, output_timeout, repo_root, run, target_dir};

const PACKAGE: &str = "memtrace-bpf";
/// Written by dist_assets; installed gzipped, as Debian installs man pages.
const MAN_PAGES: &[&str] = &[
    "memtrace-bpf.1",
    "memtrace-bpf-report.1",
    "memtrace-bpf-diff.1",
];

pub fn run_dist(dev: bool) -> Result<()> {
    let started = Instant::now();
    if std::env::consts::ARCH != "x86_64" {
        bail!(
            "`cargo xtask dist` builds an amd64 package and runs on x86_64 only (this is {})",
            std::env::consts::ARCH
        );
    }
    crate::setup::for_dist()?;
    let root = repo_root();
    let (profile, profile_dir, out) = match dev {
        false => ("release", "release", target_dir().join("dist")),
        true => ("dev", "debug", target_dir().join("dist-dev")),
    };
    run(cargo().current_dir(&root).args([
        "build",
        "--profile",
        profile,
        "-p",
        PACKAGE,
        "--bin",
        PACKAGE,
        "--example",
        "dist_assets",
    ]))?;
    let built = target_dir().join(profile_dir);
    // Where the assets in [package.metadata.deb] say (target/release/
    // there stands for the packaged profile's directory).
    let assets = built.join("dist-assets");
    if assets.exists() {
        fs::remove_dir_all(&assets).with_context(|| format!("removing {}", assets.display()))?;
    }
    run(Command::new(built.join("examples/dist_assets")).arg(&assets))?;
    for page in MAN_PAGES {
        gzip(&assets.join(page))?;
    }
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    let mut deb = cargo();
    deb.current_dir(&root)
        .args(["deb", "-p", PACKAGE, "--no-build", "--profile", profile])
        // Stripped in the package; no -dbgsym package beside it.
        .args(["--strip", "--no-separate-debug-symbols", "--no-dbgsym"])
        .arg("--output")
        .arg(&out);
    let result = output_timeout(&mut deb, std::time::Duration::from_secs(600))?;
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    eprint!("{stderr}");
    if !result.status.success() {
        bail!("`{}` failed ({}): {stdout}", describe(&deb), result.status);
    }
    // cargo-deb prints the package's path as its last line.
    let path = stdout
        .lines()
        .last()
        .filter(|l| Path::new(l).extension() == Some("deb".as_ref()))
        .with_context(|| format!("`{}` printed no .deb path: {stdout}", describe(&deb)))?;
    eprintln!(
        "xtask: dist took {:.0} s; install with `apt install {path}` (or dpkg -i)",
        started.elapsed().as_secs_f64(),
    );
    println!("{path}");
    Ok(())
}

/// `gzip -9n` (no name or time stamp: the same input gives the same bytes)
/// of `path` into `path.gz`.
fn gzip(path: &Path) -> Result<()> {
    let mut to = path.as_os_str().to_owned();
    to.push(".gz");
    let to = std::path::PathBuf::from(to);
    let file = fs::File::create(&to).with_context(|| format!("creating {}", to.display()))?;
    let status = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(path)
        .stdout(file)
        .status()
        .context("running gzip")?;
    if !status.success() {
        bail!("gzip {} failed ({status})", path.display());
    }
    Ok(())
}
