//! `cargo xtask soak`: the tracer's memory over many short-lived processes
//! (issue #11). A release-build tracer runs under `--binary` and
//! system-wide while a loop starts `python3.11 -c pass` again and again; the
//! tracer's VmRSS is sampled every few seconds. Its growth after the first
//! WARMUP processes must stay under a bound: per-process state is dropped
//! when a process exits and per-file state is shared, so thousands of runs
//! of the same program should cost about what the first few did.
//!
//! A script for a person, not a CI test (the default run takes about ten
//! minutes per scope); tests/integration/soak.rs is the short version.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cmd::{cargo, repo_root, target_dir};

/// Debian's ELF; the `python3` on PATH may be a pyenv shim script.
const PYTHON: &str = "/usr/bin/python3.11";
/// Growth is measured from the first RSS sample after this many processes.
const WARMUP: u64 = 25;

#[derive(Args)]
pub struct SoakArgs {
    /// Short processes to run per scope.
    #[arg(long, default_value_t = 10_000)]
    runs: u64,
    /// Spread the runs over about this many seconds per scope (they run
    /// back to back when they take longer).
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Fail when the RSS grows more than this (MiB) after the warm-up.
    #[arg(long, default_value_t = 40)]
    max_growth_mib: u64,
    /// Seconds between RSS samples.
    #[arg(long, default_value_t = 5)]
    every: u64,
    /// Soak this tracer binary instead of building the release one (to
    /// compare with an older build).
    #[arg(long, value_name = "PATH")]
    tracer: Option<PathBuf>,
    /// System-wide: record every process, not only python3.11 (`--comm
    /// python3.11`). On a busy host the others' heaps and stacks (which
    /// the report keeps) then dominate the growth.
    #[arg(long)]
    all_processes: bool,
    /// Which scopes to soak.
    #[arg(long, value_enum, default_value_t = Which::Both)]
    scope: Which,
    /// Extra tracer arguments (e.g. `--unwind fp`), after `--`.
    #[arg(last = true)]
    tracer_args: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Which {
    Binary,
    System,
    Both,
}

pub fn run(args: &SoakArgs) -> Result<()> {
    if !crate::cmd::is_root() {
        bail!("the soak loads BPF programs: run `cargo xtask soak` as root");
    }
    if !std::path::Path::new(PYTHON).exists() {
        bail!("{PYTHON} is missing: install Debian's python3.11 (apt-get install python3.11)");
    }
    let bin = match &args.tracer {
        Some(path) => path.clone(),
        None => {
            crate::cmd::run(cargo().current_dir(repo_root()).args([
                "build",
                "--release",
                "-p",
                "memtrace-bpf",
            ]))?;
            target_dir().join("release/memtrace-bpf")
        }
    };
    let system: &[&str] = if args.all_processes {
        &[]
    } else {
        &["--comm", "python3.11"]
    };
    let binary: (&str, &[&str]) = ("binary", &["--binary", PYTHON]);
    let scopes: Vec<(&str, &[&str])> = match args.scope {
        Which::Binary => vec![binary],
        Which::System => vec![("system-wide", system)],
        Which::Both => vec![binary, ("system-wide", system)],
    };
    let mut failed = Vec::new();
    for (name, scope_args) in scopes {
        let growth = soak(args, &bin, name, scope_args)?;
        let verdict = if growth > args.max_growth_mib as f64 {
            failed.push(name);
            "FAIL"
        } else {
            "ok"
        };
        println!(
            "soak {name}: RSS growth after the first {WARMUP} processes {growth:.1} MiB \
             (bound {} MiB): {verdict}",
            args.max_growth_mib
        );
    }
    if !failed.is_empty() {
        bail!("tracer memory grew past the bound: {}", failed.join(", "));
    }
    Ok(())
}

/// One scope: returns the RSS growth (MiB) after the warm-up.
fn soak(args: &SoakArgs, bin: &Path, name: &str, scope_args: &[&str]) -> Result<f64> {
    let dir = target_dir().join("soak");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let report = dir.join(format!("{name}.txt"));
    let mut tracer = start_tracer(bin, scope_args, &args.tracer_args, &report)?;
    let pid = tracer.id();
    let done = Arc::new(AtomicU64::new(0));
    let sampler = {
        let done = done.clone();
        let every = Duration::from_secs(args.every.max(1));
        thread::spawn(move || sample_rss(pid, &done, every))
    };
    let started = Instant::now();
    let pace = Duration::from_secs_f64(args.seconds as f64 / args.runs.max(1) as f64);
    for i in 0..args.runs {
        let status = Command::new(PYTHON)
            .args(["-c", "pass"])
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("running {PYTHON}"))?;
        if !status.success() {
            bail!("{PYTHON} -c pass failed ({status})");
        }
        done.store(i + 1, Ordering::Relaxed);
        let due = pace * (i as u32 + 1);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            thread::sleep(wait);
        }
    }
    // One more sample after the last run, then the sampler stops.
    thread::sleep(Duration::from_secs(args.every.max(1) + 1));
    done.store(u64::MAX, Ordering::Relaxed);
    let series = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the RSS sampler panicked"))?;
    // SAFETY: kill with a pid we started and have not waited for yet.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let status = tracer.wait().context("waiting for the tracer")?;
    println!(
        "soak {name}: tracer exited {status}; report in {}",
        report.display()
    );
    println!("soak {name}: seconds  processes  VmRSS MiB");
    for s in &series {
        println!(
            "soak {name}: {:7.1}  {:9}  {:9.1}",
            s.secs,
            s.runs,
            s.rss_kib as f64 / 1024.0
        );
    }
    let base = series
        .iter()
        .find(|s| s.runs >= WARMUP)
        .context("no RSS sample after the warm-up: raise --runs")?;
    let last = series.last().context("no RSS sample")?;
    Ok((last.rss_kib as f64 - base.rss_kib as f64) / 1024.0)
}

fn start_tracer(bin: &Path, scope_args: &[&str], extra: &[String], report: &Path) -> Result<Child> {
    let mut child = Command::new(bin)
        .args(scope_args)
        .args(extra)
        .arg("-o")
        .arg(report)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stderr = child.stderr.take().context("tracer stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    // Ready once it says what it traces; its later lines go to our stderr.
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                eprintln!("{line}");
                if line.starts_with("memtrace-bpf: tracing ") {
                    break;
                }
            }
            _ => bail!("the tracer exited before it started tracing"),
        }
    }
    thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("{l}")));
    Ok(child)
}

struct RssSample {
    secs: f64,
    runs: u64,
    rss_kib: u64,
}

fn sample_rss(pid: u32, done: &AtomicU64, every: Duration) -> Vec<RssSample> {
    let started = Instant::now();
    let mut out = Vec::new();
    loop {
        let runs = done.load(Ordering::Relaxed);
        if runs == u64::MAX {
            return out;
        }
        if let Some(rss_kib) = vm_rss_kib(pid) {
            out.push(RssSample {
                secs: started.elapsed().as_secs_f64(),
                runs,
                rss_kib,
            });
        }
        thread::sleep(every);
    }
}

/// VmRSS of `pid` in KiB, from /proc/PID/status.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
