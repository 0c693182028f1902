//! `cargo xtask setup`: check each toolchain piece, install only what is
//! missing, one line per piece. Takes a few seconds when all is present.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, output, run as run_cmd};

mod apt;
mod consumers;

use apt::Apt;
use consumers::{
    allocators, chromium, debuginfod, go, nodejs, otlp_proto, pip_install_in_venv,
    prometheus_parser, pythons, redis, ripgrep, speedscope, stress_ng,
};

/// bpf-linker must link against the same LLVM major as the nightly rustc
/// (22 for the pinned nightly); Debian ships it as these packages.
const LLVM_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev"];
/// Without LLVM_PREFIX, bpf-linker's build finds LLVM 14 through
/// /usr/bin/llvm-config and fails with `unable to find library -lLLVM`.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// 0.13 is the series known to build with stable 1.95 and LLVM 22.
const BPF_LINKER_VERSION: &str = "~0.13";
/// `cargo xtask dist` builds the package with it; the version whose
/// systemd fragments and options (`--no-build --profile`, `revision = ""`)
/// dist.rs and the package test were written against.
const CARGO_DEB_VERSION: &str = "3.8.0";

pub fn run() -> Result<()> {
    let mut apt = Apt::default();
    nightly()?;
    rust_src()?;
    bpf_linker(&mut apt)?;
    packaging(&mut apt)?;
    package_checkers(&mut apt)?;
    c_compiler(&mut apt)?;
    make(&mut apt)?;
    setpriv(&mut apt)?;
    allocators(&mut apt)?;
    prometheus_parser(&mut apt)?;
    redis(&mut apt)?;
    ripgrep(&mut apt)?;
    debuginfod(&mut apt)?;
    stress_ng(&mut apt)?;
    go(&mut apt)?;
    nodejs(&mut apt)?;
    pythons(&mut apt)?;
    speedscope(&mut apt)?;
    chromium(&mut apt)?;
    otlp_proto(&mut apt)?;
    lint_tools()?;
    for_kernels_with(&mut apt)
}

/// What `cargo xtask kernels` needs to boot Debian's kernels: QEMU, a
/// static busybox and depmod for virtme-ng's initramfs, and virtme-ng.
pub fn for_kernels() -> Result<()> {
    for_kernels_with(&mut Apt::default())
}

fn for_kernels_with(apt: &mut Apt) -> Result<()> {
    for package in ["qemu-system-x86", "busybox-static", "kmod"] {
        apt.ensure(&[package])?;
    }
    virtme_ng(apt)
}

/// The release `cargo xtask kernels` was measured with (docs/kernels.md).
const VIRTME_NG: &str = "virtme-ng==1.42";

/// virtme-ng boots a kernel over the host's root; from PyPI into a venv
/// under target/kernels (Debian bookworm has no package of it).
fn virtme_ng(apt: &mut Apt) -> Result<()> {
    let venv = crate::cmd::target_dir().join("kernels/venv");
    if let Some(v) = first_line(&venv.join("bin/vng").to_string_lossy(), "--version") {
        println!("ok: {v} (target/kernels/venv)");
        return Ok(());
    }
    println!(
        "installing: {VIRTME_NG} from PyPI into target/kernels/venv (for `cargo xtask kernels`)"
    );
    pip_install_in_venv(apt, &venv, VIRTME_NG)
}

/// What `cargo xtask dist` needs: the BPF toolchain for the release build
/// and the Debian packaging tools; not the test programs' pieces.
pub fn for_dist() -> Result<()> {
    let mut apt = Apt::default();
    nightly()?;
    rust_src()?;
    bpf_linker(&mut apt)?;
    packaging(&mut apt)
}

/// `cargo xtask dist`: cargo-deb, and what it runs: dpkg-shlibdeps
/// (dpkg-dev) for `Depends:` and strip (binutils); gzip for the man pages.
fn packaging(apt: &mut Apt) -> Result<()> {
    for (program, package) in [
        ("dpkg-shlibdeps", "dpkg-dev"),
        ("strip", "binutils"),
        ("gzip", "gzip"),
    ] {
        if let Some(v) = first_line(program, "--version") {
            println!("ok: {v}");
            continue;
        }
        println!("installing: {package} (for `{program}` in `cargo xtask dist`)");
        apt.ensure(&[package])?;
    }
    cargo_deb()
}

fn cargo_deb() -> Result<()> {
    let wanted = format!("cargo-deb {CARGO_DEB_VERSION}");
    match first_line("cargo-deb", "--version") {
        Some(v) if v == wanted => {
            println!("ok: {v}");
            return Ok(());
        }
        Some(v) => println!("installing: {wanted} (for `cargo xtask dist`; found {v})"),
        None => println!("installing: {wanted} (for `cargo xtask dist`, about two minutes)"),
    }
    run_cmd(cargo().args([
        "install",
        "cargo-deb",
        "--version",
        &format!("={CARGO_DEB_VERSION}"),
        "--locked",
        "--force",
    ]))?;
    let v = first_line("cargo-deb", "--version")
        .context("cargo-deb was installed but does not run: is ~/.cargo/bin on PATH?")?;
    println!("ok: {v}");
    Ok(())
}

/// The package test checks what it installs with the programs that will
/// read it: `systemd-analyze verify` (systemd) for the unit, groff and
/// `man` (man-db) for the man pages, bash, zsh and fish for the completions,
/// lintian for the whole, and systemd-nspawn (systemd-container) boots a
/// systemd to install, run and remove the service under.
fn package_checkers(apt: &mut Apt) -> Result<()> {
    for (program, arg, package) in [
        ("systemd-analyze", "--version", "systemd"),
        ("lintian", "--version", "lintian"),
        ("systemd-nspawn", "--version", "systemd-container"),
        ("groff", "--version", "groff"),
        ("man", "--version", "man-db"),
        ("zsh", "--version", "zsh"),
        ("fish", "--version", "fish"),
    ] {
        if let Some(v) = first_line(program, arg) {
            println!("ok: {v}");
            continue;
        }
        println!("installing: {package} (for the package test's `{program}`)");
        apt.ensure(&[package])?;
    }
    Ok(())
}

/// aya-build compiles the BPF crate with `cargo +nightly -Z build-std`.
fn nightly() -> Result<()> {
    let list = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("`rustup toolchain list` failed: is rustup installed and on PATH?")?;
    // `nightly-<host>`, not a dated `nightly-2026-...`: `+nightly` names the former.
    let present = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .any(|t| {
            t == "nightly"
                || t.strip_prefix("nightly-")
                    .is_some_and(|rest| !rest.starts_with(|c: char| c.is_ascii_digit()))
        });
    if !present {
        bail!(
            "no `nightly` rustup toolchain: the BPF programs are built with it. \
             Machines of this kind come with one installed; on another machine run \
             `rustup toolchain install nightly --component rust-src`"
        );
    }
    let version = output(
        Command::new("rustc")
            .args(["+nightly", "--version"])
            // Never let a probe download anything.
            .env("RUSTUP_AUTO_INSTALL", "0"),
    )
    .unwrap_or_else(|| "nightly".into());
    println!("ok: {}", version.trim());
    Ok(())
}

/// `-Z build-std=core` needs the standard library's source.
fn rust_src() -> Result<()> {
    if has_components(Some("nightly"), &["rust-src"]) {
        println!("ok: rust-src (nightly)");
        return Ok(());
    }
    println!("installing: rust-src (nightly)");
    run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("bpf-linker", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: bpf-linker {BPF_LINKER_VERSION} with LLVM 22 (about a minute)");
    apt.ensure(LLVM_PACKAGES)?;
    run_cmd(
        cargo()
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
            ])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", LLVM_PREFIX),
    )?;
    let v = first_line("bpf-linker", "--version")
        .context("bpf-linker was installed but does not run: is ~/.cargo/bin on PATH?")?;
    println!("ok: {v}");
    Ok(())
}

/// The integration tests and the demo compile C target programs.
fn c_compiler(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("cc", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: gcc (for `cc`)");
    apt.ensure(&["gcc", "libc6-dev"])
}

/// tikv-jemalloc-sys (the Rust jemalloc test program) builds jemalloc with make.
fn make(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("make", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: make (for the tikv-jemallocator test program)");
    apt.ensure(&["make"])
}

/// Tests drop privileges with setpriv to check the non-root error paths.
fn setpriv(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("setpriv", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: util-linux (for `setpriv`)");
    apt.ensure(&["util-linux"])
}

/// `cargo xtask test` runs clippy and rustfmt on the default toolchain.
fn lint_tools() -> Result<()> {
    if has_components(None, &["clippy", "rustfmt"]) {
        println!("ok: clippy, rustfmt");
        return Ok(());
    }
    println!("installing: clippy, rustfmt");
    run_cmd(Command::new("rustup").args(["component", "add", "clippy", "rustfmt"]))
}

/// Whether all `names` are installed components of `toolchain` (None: the
/// toolchain in force here). Installed names look like `rust-src` or
/// `clippy-x86_64-unknown-linux-gnu`.
fn has_components(toolchain: Option<&str>, names: &[&str]) -> bool {
    let mut cmd = Command::new("rustup");
    cmd.args(["component", "list", "--installed"]);
    if let Some(t) = toolchain {
        cmd.args(["--toolchain", t]);
    }
    let Some(list) = output(&mut cmd) else {
        return false;
    };
    names.iter().all(|name| {
        list.lines().map(str::trim).any(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
        })
    })
}

/// First line of `program arg`'s stdout, if it runs and succeeds.
fn first_line(program: &str, arg: &str) -> Option<String> {
    let out = output(Command::new(program).arg(arg))?;
    out.lines().next().map(|l| l.trim().to_owned())
}
