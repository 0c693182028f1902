//! `cargo xtask dist`: target/dist/memtrace-bpf_VERSION_amd64.deb, built
//! with dpkg-deb from
//!
//! - the release binary (the BPF object is inside it: tracer/build.rs
//!   builds it and probes/loader.rs embeds it with `include_bytes_aligned!`),
//!   its debug info stripped;
//! - man pages and bash, zsh and fish completions generated from the clap
//!   definition by tracer/examples/dist_assets.rs;
//! - docs/*.md in /usr/share/doc/memtrace-bpf, where --help's and the man
//!   pages' docs/NAME.md pointers lead;
//! - dist/memtrace-bpf.service (a system-wide sampled trace served on
//!   127.0.0.1:6060) and dist/memtrace-bpf.default, installed as
//!   /etc/default/memtrace-bpf and marked a conffile (dpkg keeps the
//!   administrator's edits across upgrades).
//!
//! `Depends:` comes from dpkg-shlibdeps (the libc6 and libgcc-s1 versions
//! the binary's symbol versions need); `Version:` is memtrace-bpf's version
//! in Cargo.toml. The last line on stdout is the package's path.
//!
//! `--dev` packages the dev-profile binary into target/dist-dev instead:
//! the same package from the build the tests already make (the package
//! test and `cargo xtask test` use it; the release build takes 5-12
//! minutes more on two cores).

use std::{fs, path::Path, process::Command, time::Instant};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, describe, output_timeout, repo_root, run, target_dir};

const PACKAGE: &str = "memtrace-bpf";
const ARCH: &str = "amd64";
/// Where the package's files go; the unit names /usr/bin/memtrace-bpf.
const BIN_PATH: &str = "usr/bin/memtrace-bpf";
/// Debian 12 (bookworm) and older look for units here; with merged /usr it
/// is /usr/lib/systemd/system too.
const UNIT_PATH: &str = "lib/systemd/system/memtrace-bpf.service";
const DEFAULT_PATH: &str = "etc/default/memtrace-bpf";
const MAN_DIR: &str = "usr/share/man/man1";
const DOC_DIR: &str = "usr/share/doc/memtrace-bpf";
/// (file written by dist_assets under completions/, where the shell looks).
const COMPLETIONS: &[(&str, &str)] = &[
    (
        "memtrace-bpf.bash",
        "usr/share/bash-completion/completions/memtrace-bpf",
    ),
    (
        "_memtrace-bpf",
        "usr/share/zsh/vendor-completions/_memtrace-bpf",
    ),
    (
        "memtrace-bpf.fish",
        "usr/share/fish/vendor_completions.d/memtrace-bpf.fish",
    ),
];
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
    let mut build = cargo();
    build.current_dir(&root).arg("build");
    if !dev {
        build.arg("--release");
    }
    run(build.args(["-p", PACKAGE, "--bin", PACKAGE, "--example", "dist_assets"]))?;
    let (release, out) = match dev {
        false => (target_dir().join("release"), target_dir().join("dist")),
        true => (target_dir().join("debug"), target_dir().join("dist-dev")),
    };
    let stage = out.join("root");
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let assets = out.join("assets");
    run(Command::new(release.join("examples/dist_assets")).arg(&assets))?;

    let bin = stage.join(BIN_PATH);
    make_parent(&bin)?;
    // Debian ships binaries without debug info; the symbol table stays (for
    // backtraces). The BPF object is data in .rodata and is kept.
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(release.join(PACKAGE))
        .arg(&bin))?;
    for page in MAN_PAGES {
        let dest = stage.join(MAN_DIR).join(format!("{page}.gz"));
        gzip_to(&assets.join(page), &dest)?;
    }
    for (file, dest) in COMPLETIONS {
        install(&assets.join("completions").join(file), &stage.join(dest))?;
    }
    let dist = root.join("dist");
    install(&dist.join("memtrace-bpf.service"), &stage.join(UNIT_PATH))?;
    install(
        &dist.join("memtrace-bpf.default"),
        &stage.join(DEFAULT_PATH),
    )?;
    install(
        &dist.join("copyright"),
        &stage.join(DOC_DIR).join("copyright"),
    )?;
    // The documents --help and the man pages name as docs/NAME.md (the
    // man pages' FILES section says where they are).
    for entry in fs::read_dir(root.join("docs")).context("reading docs/")? {
        let path = entry?.path();
        if let Some(name) = path
            .file_name()
            .filter(|_| path.extension() == Some("md".as_ref()))
        {
            install(&path, &stage.join(DOC_DIR).join(name))?;
        }
    }

    let version = package_version()?;
    let depends = shlib_depends(&bin, &out)?;
    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    fs::write(
        debian.join("control"),
        control(&version, &depends, installed_kib(&stage)?),
    )?;
    // debhelper would list every file under /etc; built by hand, the
    // package lists its one conffile itself.
    fs::write(debian.join("conffiles"), format!("/{DEFAULT_PATH}\n"))?;

    let deb = out.join(format!("{PACKAGE}_{version}_{ARCH}.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    eprintln!(
        "xtask: dist took {:.0} s; install with `apt install {}` (or dpkg -i)",
        started.elapsed().as_secs_f64(),
        deb.display()
    );
    println!("{}", deb.display());
    Ok(())
}

/// memtrace-bpf's version as Cargo.toml gives it (`cargo metadata`).
fn package_version() -> Result<String> {
    let out = output_timeout(
        cargo()
            .current_dir(repo_root())
            .args(["metadata", "--no-deps", "--format-version", "1"]),
        std::time::Duration::from_secs(120),
    )?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let version = meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == PACKAGE))
        .and_then(|p| p["version"].as_str())
        .context("cargo metadata lists no memtrace-bpf package with a version")?;
    // Debian versions may not contain `-` without a Debian revision; a
    // Cargo pre-release (0.2.0-rc.1) sorts before its release with `~`.
    Ok(version.replacen('-', "~", 1))
}

/// `Depends:` for `bin` from dpkg-shlibdeps, which reads the shared
/// libraries it needs and the symbol versions it uses. It insists on a
/// debian/control, so it runs in a scratch directory holding a minimal one.
fn shlib_depends(bin: &Path, out: &Path) -> Result<String> {
    let work = out.join("shlibdeps");
    fs::create_dir_all(work.join("debian"))?;
    fs::write(
        work.join("debian/control"),
        format!("Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: {ARCH}\n"),
    )?;
    let mut cmd = Command::new("dpkg-shlibdeps");
    cmd.current_dir(&work).arg("-O").arg(bin);
    let result = output_timeout(&mut cmd, std::time::Duration::from_secs(120))?;
    let _ = fs::remove_dir_all(&work);
    if !result.status.success() {
        bail!(
            "`{}` failed: {}",
            describe(&cmd),
            String::from_utf8_lossy(&result.stderr)
        );
    }
    let text = String::from_utf8_lossy(&result.stdout);
    let depends = text
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .with_context(|| format!("dpkg-shlibdeps printed no shlibs:Depends line: {text}"))?;
    if !depends.contains("libc6") {
        bail!("dpkg-shlibdeps found no libc6 dependency ({depends}): is the binary static?");
    }
    Ok(depends.trim().to_owned())
}

fn control(version: &str, depends: &str, installed_kib: u64) -> String {
    format!(
        "Package: {PACKAGE}\n\
         Version: {version}\n\
         Architecture: {ARCH}\n\
         Maintainer: memtrace-bpf developers <memtrace-bpf@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: {depends}\n\
         Section: devel\n\
         Priority: optional\n\
         Description: trace live heap allocations of running processes with eBPF\n \
         memtrace-bpf attaches uprobes to the allocator functions (glibc, jemalloc,\n \
         tcmalloc, mimalloc) of running processes, samples allocations with their\n \
         call stacks and reports where the outstanding memory was allocated: text,\n \
         collapsed stacks, flamegraph SVG, JSON, pprof, speedscope, or over HTTP\n \
         for go tool pprof, Pyroscope, Parca and Prometheus.\n \
         .\n \
         The memtrace-bpf service (not enabled on install) traces every process\n \
         with sampled allocations and serves the live profile on 127.0.0.1:6060;\n \
         its flags are in /etc/default/memtrace-bpf. Needs a kernel with uprobes\n \
         and BTF; runs as root.\n"
    )
}

/// The staged files' size in KiB, as dpkg expects in `Installed-Size`.
fn installed_kib(stage: &Path) -> Result<u64> {
    fn walk(dir: &Path, total: &mut u64) -> Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                walk(&entry.path(), total)?;
            } else {
                *total += meta.len().div_ceil(1024);
            }
        }
        Ok(())
    }
    let mut total = 0;
    walk(stage, &mut total)?;
    Ok(total)
}

fn make_parent(path: &Path) -> Result<()> {
    let parent = path.parent().context("a path inside the staging tree")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))
}

/// Copies `from` to `to` with mode 0644 (the repository's modes do not
/// matter; the package's do).
fn install(from: &Path, to: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    make_parent(to)?;
    fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

/// `gzip -9n` (no name or time stamp: the same input gives the same bytes)
/// of `from` into `to`, as Debian installs man pages.
fn gzip_to(from: &Path, to: &Path) -> Result<()> {
    make_parent(to)?;
    let file = fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let status = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(from)
        .stdout(file)
        .status()
        .context("running gzip")?;
    if !status.success() {
        bail!("gzip {} failed ({status})", from.display());
    }
    Ok(())
}
