//! The programs the tests trace and the consumers they hand reports to:
//! allocators, servers, language runtimes, viewers, parsers.

use std::process::Command;

use anyhow::{bail, Result};

use super::{first_line, Apt};
use crate::cmd::run as run_cmd;

/// The tests trace programs with Debian's jemalloc, tcmalloc and mimalloc
/// (and heaptrack's preload library) preloaded or linked (by the library's path: no -dev package needed).
pub(super) fn allocators(apt: &mut Apt) -> Result<()> {
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
pub(super) fn stress_ng(apt: &mut Apt) -> Result<()> {
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
pub(super) fn redis(apt: &mut Apt) -> Result<()> {
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
pub(super) fn ripgrep(apt: &mut Apt) -> Result<()> {
    if std::path::Path::new("/usr/bin/rg").exists() {
        println!("ok: /usr/bin/rg");
        return Ok(());
    }
    println!("installing: ripgrep (for the ripgrep test)");
    apt.ensure(&["ripgrep"])
}

/// The debuginfod test serves a directory of debug files with elfutils'
/// own server (Debian's `debuginfod`, `debuginfod -F DIR`).
pub(super) fn debuginfod(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("debuginfod", "--version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: debuginfod (elfutils' server, for the debuginfod test)");
    apt.ensure(&["debuginfod"])
}

/// The pprof tests open our files with the real consumer, `go tool pprof`
/// (Debian's golang-go; its pprof works offline).
pub(super) fn go(apt: &mut Apt) -> Result<()> {
    if let Some(v) = first_line("go", "version") {
        println!("ok: {v}");
        return Ok(());
    }
    println!("installing: golang-go (for `go tool pprof` in the pprof tests)");
    apt.ensure(&["golang-go"])
}

/// The JIT-names test traces node `--perf-basic-prof` (Debian's nodejs;
/// npm comes with it for the speedscope package).
pub(super) fn nodejs(apt: &mut Apt) -> Result<()> {
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
pub(super) fn pythons(apt: &mut Apt) -> Result<()> {
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
pub(super) fn speedscope(apt: &mut Apt) -> Result<()> {
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
pub(super) fn chromium(apt: &mut Apt) -> Result<()> {
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
pub(super) fn otlp_proto(apt: &mut Apt) -> Result<()> {
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
pub(super) fn pip_install_in_venv(
    apt: &mut Apt,
    venv: &std::path::Path,
    package: &str,
) -> Result<()> {
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
pub(super) fn prometheus_parser(apt: &mut Apt) -> Result<()> {
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
