//! `cargo xtask`: orchestration for memtrace-bpf (setup, build, test, demo,
//! bench, bench-redis, fuzz, soak, kernels, loaded).
//!
//! The BPF object is built by tracer/build.rs (aya-build) during an ordinary
//! `cargo build`; nothing here builds it a second time.

mod bench;
mod bench_proc;
mod bench_redis;
mod bench_report;
mod cmd;
mod cpu;
mod demo;
mod dist;
mod fuzz;
mod kernels;
mod loaded;
mod setup;
mod soak;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

use crate::cmd::{cargo, repo_root, run};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "memtrace-bpf development tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Check the toolchain pieces and install whichever are missing.
    Setup,
    /// `setup`, then build the release binary target/release/memtrace-bpf.
    Build,
    /// `setup`, `dist`, then all tests (needs root), clippy, rustfmt and
    /// the kernel matrix (`kernels`).
    Test {
        /// Skip the kernel matrix (ignored when CI=true: CI always runs it).
        #[arg(long)]
        no_kernels: bool,
        /// Extra arguments for `cargo test`, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// `setup`, build, and trace the bundled leaky demo program.
    Demo,
    /// Build target/dist/memtrace-bpf_VERSION_amd64.deb: the release
    /// binary, man pages, shell completions, a systemd unit and
    /// /etc/default/memtrace-bpf (docs/packaging.md).
    Dist {
        /// Package the dev-profile binary the tests build instead (into
        /// target/dist-dev): the same files, built in a fraction of the
        /// release build's time; what `cargo xtask test` checks.
        #[arg(long)]
        dev: bool,
    },
    /// The cost of tracing (exact and sampled, fp and tables unwinding) against no-op probes.
    Bench,
    /// redis-benchmark throughput and redis-server CPU per request,
    /// untraced and traced by `--pid`, `--binary`, `--cgroup` and
    /// system-wide (target/bench/redis.json).
    BenchRedis {
        /// Interleaved rounds of all modes (medians over them).
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// Attempts per run while other processes disturb it (1: keep
        /// every run, counted as disturbed in the table).
        #[arg(long, default_value_t = 4)]
        attempts: usize,
    },
    /// Time and peak memory of the report of 100,000 distinct 17-frame
    /// stacks (exact mode), per format; and in DWARF mode.
    BenchReport(bench_report::BenchReportArgs),
    /// Fuzz the parsers of what traced processes control (ELF files, maps,
    /// ld.so.conf, probe placement) for a bounded time each.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target (elf, maps, ld_so_conf, placement).
        #[arg(long)]
        target: Option<String>,
    },
    /// Boot Debian's kernels (5.10, 6.1, 6.12, newest) in QEMU and run
    /// the same traces on each; a table of what passes where
    /// (docs/kernels.md).
    Kernels(kernels::KernelsArgs),
    /// Integration tests matching a filter, run again and again under
    /// `stress-ng --cpu 4` (20 runs by default).
    Loaded(loaded::LoadedArgs),
    /// The tracer's RSS over thousands of short-lived python3.11 runs
    /// (--binary and system-wide); fails if it grows past a bound.
    Soak(soak::SoakArgs),
}

fn main() -> Result<()> {
    cmd::put_cargo_bin_on_path();
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Build => {
            setup::run()?;
            build_release()
        }
        Task::Test { args, no_kernels } => test(&args, no_kernels),
        Task::Demo => demo::run(),
        Task::Dist { dev } => dist::run_dist(dev),
        Task::Bench => bench::run(),
        Task::BenchRedis { rounds, attempts } => bench_redis::run(rounds, attempts.max(1)),
        Task::BenchReport(args) => bench_report::run(&args),
        Task::Fuzz { seconds, target } => {
            setup::run()?;
            fuzz::run(seconds, target.as_deref())
        }
        Task::Soak(args) => soak::run(&args),
        Task::Kernels(args) => kernels::run(&args),
        Task::Loaded(args) => loaded::run(&args),
    }
}

fn build_release() -> Result<()> {
    run(cargo()
        .current_dir(repo_root())
        .args(["build", "--release", "-p", "memtrace-bpf"]))
}

/// Builds the package, then runs tests, clippy, rustfmt and the kernel
/// matrix, so the test results print first; every step runs and any
/// failure fails the command.
fn test(extra: &[String], no_kernels: bool) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "the integration tests load BPF programs and need root; \
             run `cargo xtask test` as root (they are not skipped)"
        );
    }
    setup::run()?;
    // The package test (tests/integration/dist.rs) runs `cargo xtask dist
    // --dev` itself; building it here first keeps that build from competing
    // with the other tests for the CPU. The dev binary is the one the tests
    // build anyway; a release build would add 5-12 minutes here.
    let mut failed = Vec::new();
    if let Err(e) = dist::run_dist(true) {
        eprintln!("xtask: dist failed: {e:#}");
        failed.push("cargo xtask dist --dev");
    }
    let root = repo_root();
    let mut tests = cargo();
    tests
        .current_dir(&root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra);
    let mut clippy = cargo();
    clippy.current_dir(&root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    let mut fmt = cargo();
    fmt.current_dir(&root).args(["fmt", "--all", "--check"]);

    for (name, mut step) in [
        ("cargo test", tests),
        ("cargo clippy", clippy),
        ("cargo fmt --check", fmt),
    ] {
        if let Err(e) = run(&mut step) {
            eprintln!("xtask: {name} failed: {e:#}");
            failed.push(name);
        }
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if no_kernels && !ci {
        println!("xtask: kernel matrix skipped (--no-kernels)");
    } else {
        if no_kernels {
            println!("xtask: CI=true: --no-kernels ignored, the kernel matrix runs");
        }
        if let Err(e) = kernels::run(&kernels::KernelsArgs::all()) {
            eprintln!("xtask: cargo xtask kernels failed: {e:#}");
            failed.push("cargo xtask kernels");
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    println!("all tests, clippy, rustfmt and the kernel matrix passed");
    Ok(())
}
