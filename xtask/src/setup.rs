//! `cargo xtask setup`: check each toolchain piece, install only what is
//! missing, one line per piece. Takes a few seconds when all is present.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, is_root, output, run as run_cmd};

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

/// The tests trace programs with Debian's jemalloc, tcmalloc and mimalloc
/// (and heaptrack's preload library) preloaded or linked (by the library's path: no -dev package needed).
fn allocators(apt: &mut Apt) -> Result<()> {
    for (lib, package) in [
        ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
        (
            "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
            "libtcmalloc-minimal4",
        ),
        (
            "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2",
            "libmimalloc2.0",
        ),
        // A malloc interposer that is no allocator (its kind is tested).
        ("/usr/lib/heaptrack/libheaptrack_preload.so", "heaptrack"),
    ] {
        if std::path::Path::new(lib).exists() {
            println!("ok: {lib}");
            continue;
        }
        println!("installing: {package} (for the allocator tests)");
        apt.ensure(&[package])?;
    }
    Ok(())
}

/// stress-ng, the load `cargo xtask loaded` runs tests under.
fn stress_ng(apt: &mut Apt) -> Result<()> {
    if std::path::Path::new("/usr/bin/stress-ng").exists() {
        println!("ok: /usr/bin/stress-ng");
        return Ok(());
    }
    println!("installing: stress-ng (for `cargo xtask loaded`)");
    apt.ensure(&["stress-ng"])
}

/// A real third-party server for the redis test and `cargo xtask
/// bench-redis`: Debian's redis-server (linked with libjemalloc.so.2) and
/// redis-tools (redis-cli, redis-benchmark). They start their own server on
/// a free port; a service the package may start on 6379 is not used.
fn redis(apt: &mut Apt) -> Result<()> {
    for (program, package) in [
        ("/usr/bin/redis-server", "redis-server"),
        ("/usr/bin/redis-cli", "redis-tools"),
        ("/usr/bin/redis-benchmark", "redis-tools"),
    ] {
        if std::path::Path::new(program).exists() {
            println!("ok: {program}");
            continue;
        }
        println!("installing: {package} (for the redis test and bench-redis)");
        apt.ensure(&[package])?;
    }
    Ok(())
}

/// A Rust program nobody here wrote, without frame pointers and with
/// frames larger than any stack copy: Debian's ripgrep, for the ripgrep
/// test of complete stacks.
fn ripgrep(apt: &mut Apt) -> Result<()> {
    if std::path::Path::new("/usr/bin/rg").exists() {
        println!("ok: /usr/bin/rg");
        return Ok(());
    }
    println!("installing: ripgrep (for the ripgrep test)");
    apt.ensure(&["ripgrep"])
}

/// The debuginfod test serves a directory of debug files with elfutils'
/// own server (Debian's `debuginfod`, `debuginfod -F DIR`).
fn debuginfod(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("debuginfod", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: debuginfod (elfutils' server, for the debuginfod test)");
    apt.ensure(&["debuginfod"])
}

/// The pprof tests open our files with the real consumer, `go tool pprof`
/// (Debian's golang-go; its pprof works offline).
fn go(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("go", "version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: golang-go (for `go tool pprof` in the pprof tests)");
    apt.ensure(&["golang-go"])
}

/// The JIT-names test traces node `--perf-basic-prof` (Debian's nodejs;
/// npm comes with it for the speedscope package).
fn nodejs(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("node", "--version") {
        println!("ok: node {v}");
        return Ok(());
    }
    println!("installing: nodejs (for the JIT-names test)");
    apt.ensure(&["nodejs", "npm"])
}

/// The CPython versions the `-X perf` test traces (their perf
/// trampolines: 11-byte copies in 3.12, 16 in 3.13).
const PYTHONS: &[&str] = &["3.12.1", "3.13.0"];

/// tests/integration/python_perf.rs runs pyenv's CPython 3.12 and 3.13
/// (the newest patch release of each under `$PYENV_ROOT/versions`, or
/// ~/.pyenv). Debian 12 has neither, and none of the package registries
/// this project reaches ships a prebuilt CPython; machines of this kind
/// come with them. Where one is missing, `pyenv install` builds it from
/// python.org's source (a few minutes each on 2 cores).
fn pythons(apt: &mut Apt) -> Result<()> {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".pyenv"),
        std::path::PathBuf::from,
    );
    for version in PYTHONS {
        let minor = version.rsplit_once('.').map_or(*version, |(m, _)| m);
        let present = std::fs::read_dir(root.join("versions"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.strip_prefix(minor)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(|patch| patch.parse::<u32>().is_ok())
            })
            .any(|e| e.path().join(format!("bin/python{minor}")).is_file());
        if present {
            println!("ok: CPython {minor} (pyenv, {})", root.display());
            continue;
        }
        if first_line("pyenv", "--version").is_none() {
            bail!(
                "CPython {minor} is missing under {}/versions and pyenv is not installed: \
                 the -X perf test needs it; install pyenv and run `pyenv install {version}`",
                root.display()
            );
        }
        println!("installing: CPython {version} with pyenv (for the -X perf test; minutes)");
        apt.ensure(&[
            "libssl-dev",
            "zlib1g-dev",
            "libffi-dev",
            "libbz2-dev",
            "libreadline-dev",
            "libsqlite3-dev",
            "liblzma-dev",
        ])?;
        run_cmd(Command::new("pyenv").args(["install", "--skip-existing", version]))?;
    }
    Ok(())
}

/// The speedscope test validates our file against the schema shipped in the
/// `speedscope` npm package (installed under target/speedscope) with
/// Debian's python3-jsonschema.
fn speedscope(apt: &mut Apt) -> Result<()> {
    let has_validator = Command::new("/usr/bin/python3")
        .args(["-c", "import jsonschema"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has_validator {
        println!("ok: python3-jsonschema");
    } else {
        println!("installing: python3-jsonschema (for the speedscope test)");
        apt.ensure(&["python3-jsonschema"])?;
    }
    let dir = crate::cmd::target_dir().join("speedscope");
    let schema = dir.join("node_modules/speedscope/dist/release/file-format-schema.json");
    if schema.is_file() {
        println!("ok: the speedscope npm package");
        return Ok(());
    }
    println!("installing: the speedscope npm package (for its file-format schema)");
    std::fs::create_dir_all(&dir)?;
    run_cmd(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg("speedscope@1"),
    )
}

/// The speedscope and live-page tests open pages in headless Chromium
/// (Debian's `chromium`; tests/integration/chromium.rs drives it).
fn chromium(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("chromium", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: chromium (for the speedscope and live-page tests, headless)");
    apt.ensure(&["chromium"])
}

/// The `opentelemetry-proto` release the --otlp tests decode with: 1.45.2
/// has `opentelemetry.proto.profiles.v1development` with the layout of the
/// protos vendored in tracer/proto/opentelemetry (checked field by field).
const OTLP_PROTO: &str = "opentelemetry-proto==1.45.2";

/// The --otlp tests' receiver (tests/integration/harness/otlp_receiver.py)
/// decodes with the official Python package, from PyPI into a venv under
/// target/ (Debian has no package of it).
fn otlp_proto(apt: &mut Apt) -> Result<()> {
    let venv = crate::cmd::target_dir().join("otlp-venv");
    let python = venv.join("bin/python");
    let has = Command::new(&python)
        .args([
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has {
        println!("ok: {OTLP_PROTO} (target/otlp-venv)");
        return Ok(());
    }
    println!("installing: {OTLP_PROTO} from PyPI into target/otlp-venv (for the --otlp tests)");
    pip_install_in_venv(apt, &venv, OTLP_PROTO)
}

/// Makes a venv at `venv` with Debian's python3 (python3-venv installed
/// if it lacks ensurepip) and pip-installs `package` into it. `--clear`
/// empties a venv left broken there (one whose interpreter link points at
/// a python that is gone), which `venv` alone leaves as it is.
fn pip_install_in_venv(apt: &mut Apt, venv: &std::path::Path, package: &str) -> Result<()> {
    let venv_works = Command::new("/usr/bin/python3")
        .args(["-c", "import ensurepip, venv"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !venv_works {
        apt.ensure(&["python3-venv"])?;
    }
    run_cmd(
        Command::new("/usr/bin/python3")
            .args(["-m", "venv", "--clear"])
            .arg(venv),
    )?;
    run_cmd(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(package),
    )
}

/// The --serve test parses /metrics with the Prometheus client library's
/// own text parser (Debian's python3-prometheus-client).
fn prometheus_parser(apt: &mut Apt) -> Result<()> {
    let has = Command::new("/usr/bin/python3")
        .args(["-c", "import prometheus_client.parser"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if has {
        println!("ok: python3-prometheus-client");
        return Ok(());
    }
    println!("installing: python3-prometheus-client (for the --serve /metrics test)");
    apt.ensure(&["python3-prometheus-client"])
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

/// apt-get, with `apt-get update` run at most once per setup.
#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    fn ensure(&mut self, packages: &[&str]) -> Result<()> {
        let missing: Vec<&str> = packages
            .iter()
            .copied()
            .filter(|p| !dpkg_installed(p))
            .collect();
        if missing.is_empty() {
            println!("ok: {}", packages.join(", "));
            return Ok(());
        }
        println!("installing: {} (apt-get)", missing.join(", "));
        if !self.updated {
            run_cmd(&mut self.apt_get(&missing, &["update"])?)?;
            self.updated = true;
        }
        let mut args = vec!["install", "-y"];
        args.extend(&missing);
        run_cmd(&mut self.apt_get(&missing, &args)?)
    }

    /// `apt-get ARGS` as root, via sudo otherwise.
    fn apt_get(&self, missing: &[&str], args: &[&str]) -> Result<Command> {
        // No prompts: CI runs without a terminal on stdin.
        const NONINTERACTIVE: &str = "DEBIAN_FRONTEND=noninteractive";
        if is_root() {
            let mut cmd = Command::new("apt-get");
            cmd.env("DEBIAN_FRONTEND", "noninteractive").args(args);
            return Ok(cmd);
        }
        if first_line("sudo", "--version").is_none() {
            bail!(
                "need the apt packages {0} but not root and `sudo` is not installed; \
                 as root, run: apt-get update && apt-get install -y {0}",
                missing.join(" ")
            );
        }
        let mut cmd = Command::new("sudo");
        cmd.args([NONINTERACTIVE, "apt-get"]).args(args);
        Ok(cmd)
    }
}

fn dpkg_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.trim() == "install ok installed")
}
