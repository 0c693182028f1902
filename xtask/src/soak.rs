//! `cargo xtask soak`: the tracer's memory over long traces.
//!
//! Three scopes, each traced by a release-build tracer with `--verbose`
//! (its stats line every 10 s gives the kernel LIVE map's size over time)
//! while the tracer's VmRSS is sampled every few seconds:
//! - `single`: one C process doing about 1 M allocations/s of churn plus a
//!   slow leak of known rate (tests/targets/soak_leak.c), at the default
//!   sample rate: RSS flat after the first minute, the leak found within
//!   15 %, no losses beyond what sampling explains (see `single`);
//! - `binary` and `system`: `--binary python3.11` and system-wide (`--comm
//!   python3.11`) while a loop starts `python3.11 -c pass` again and again:
//!   RSS flat after the first WARMUP processes and the LIVE map flat after
//!   the first minute (per-process state is dropped when a process exits,
//!   per-file state is shared, exited processes leave the kernel maps).
//!
//! A script for a person, not a CI test (the default run takes about ten
//! minutes per scope); tests/integration/soak.rs holds the short versions.

mod agent;
mod monitor;
mod single;
mod tables;

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::cmd::{cargo, repo_root, target_dir};
use monitor::{Monitor, Series};

/// Debian's ELF; the `python3` on PATH may be a pyenv shim script.
const PYTHON: &str = "/usr/bin/python3.11";
/// Growth is measured from the first RSS sample after this many processes.
const WARMUP: u64 = 25;

#[derive(Args)]
pub struct SoakArgs {
    /// Short processes to run per scope (binary, system).
    #[arg(long, default_value_t = 10_000)]
    runs: u64,
    /// How long each scope runs: the python runs are spread over about
    /// this many seconds (back to back when they take longer); the single
    /// process allocates for this long.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Fail when the RSS grows more than this (MiB) after the warm-up.
    #[arg(long, default_value_t = 40)]
    max_growth_mib: u64,
    /// Fail when the LIVE map's entries grow more than this after the
    /// first minute (binary, system).
    #[arg(long, default_value_t = 500)]
    max_live_growth: u64,
    /// The warm-up in seconds ("the first minute"); at most a quarter of
    /// --seconds.
    #[arg(long, default_value_t = 60)]
    warmup_secs: u64,
    /// Seconds between RSS samples.
    #[arg(long, default_value_t = 5)]
    every: u64,
    /// single: allocations per second asked of the target, in all.
    #[arg(long, default_value_t = 1_000_000)]
    rate: u64,
    /// single: threads sharing the churn.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// single: bytes leaked per second.
    #[arg(long, default_value_t = 1 << 20)]
    leak: u64,
    /// single: size of each leaked block.
    #[arg(long, default_value_t = 4096)]
    leak_block: u64,
    /// Soak this tracer binary instead of building the release one (to
    /// compare with an older build).
    #[arg(long, value_name = "PATH")]
    tracer: Option<PathBuf>,
    /// System-wide: record every process, not only python3.11 (`--comm
    /// python3.11`). On a busy host the others' heaps and stacks (which
    /// the report keeps) then dominate the growth.
    #[arg(long)]
    all_processes: bool,
    /// Which scopes to soak (`both` = binary and system; `all` = single,
    /// binary and system; `tables` is run alone).
    #[arg(long, value_enum, default_value_t = Which::All)]
    scope: Which,
    /// tables: fail when the rows in use after the loop exceed those
    /// before it by more than this (other processes on the host come and
    /// go too).
    #[arg(long, default_value_t = 100_000)]
    max_rows_growth: u64,
    /// tables: the same for UNWIND_MAPPINGS entries.
    #[arg(long, default_value_t = 2_000)]
    max_mappings_growth: u64,
    /// Extra tracer arguments (e.g. `--unwind fp`), after `--`.
    #[arg(last = true)]
    tracer_args: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Which {
    Single,
    Binary,
    System,
    Both,
    All,
    /// System-wide, every process, while python3.11, cc and rg start in
    /// turn: RSS and the unwind tables' rows and trie entries.
    Tables,
    /// `memtrace-bpf agent` with a trigger firing about once a minute: its
    /// RSS (run alone; `--seconds 3600` for the hour the agent is held to).
    Agent,
}

/// What a scope found: lines to print, and what failed.
#[derive(Default)]
pub struct Verdict {
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Verdict {
    fn say(&mut self, line: String) {
        println!("{line}");
        self.lines.push(line);
    }

    /// Says `what` with `ok` or FAIL.
    fn check(&mut self, pass: bool, what: String) {
        let verdict = if pass { "ok" } else { "FAIL" };
        self.say(format!("{what}: {verdict}"));
        if !pass {
            self.failures.push(what);
        }
    }
}

pub fn run(args: &SoakArgs) -> Result<()> {
    if !crate::cmd::is_root() {
        bail!("the soak loads BPF programs: run `cargo xtask soak` as root");
    }
    let scopes: &[Which] = match args.scope {
        Which::Both => &[Which::Binary, Which::System],
        Which::All => &[Which::Single, Which::Binary, Which::System],
        ref one => std::slice::from_ref(one),
    };
    let python = |s: &Which| matches!(s, Which::Binary | Which::System | Which::Tables);
    if scopes.iter().any(python) && !Path::new(PYTHON).exists() {
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
    let mut verdicts = Vec::new();
    for scope in scopes {
        let verdict = match scope {
            Which::Single => single::soak(args, &bin)?,
            Which::Tables => tables::soak(args, &bin)?,
            Which::Agent => agent::soak(args, &bin)?,
            Which::Binary => python_soak(args, &bin, "binary", &["--binary", PYTHON])?,
            _ => python_soak(args, &bin, "system-wide", system)?,
        };
        verdicts.push(verdict);
    }
    println!("\nsoak summary:");
    for line in verdicts.iter().flat_map(|v| &v.lines) {
        println!("{line}");
    }
    let failed: Vec<&String> = verdicts.iter().flat_map(|v| &v.failures).collect();
    if !failed.is_empty() {
        bail!(
            "soak failed: {}",
            failed
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}

/// The warm-up: the first minute, or a quarter of a shorter run.
fn warmup(args: &SoakArgs) -> f64 {
    (args.warmup_secs as f64).min(args.seconds as f64 / 4.0)
}

/// One python scope: a loop of short python3.11 runs while traced.
fn python_soak(args: &SoakArgs, bin: &Path, name: &str, scope_args: &[&str]) -> Result<Verdict> {
    let _lock = match scope_args.first() {
        Some(&"--binary") => None,
        _ => Some(system_wide_lock()?),
    };
    let monitor = Monitor::start(bin, name, scope_args, &args.tracer_args, args.every)?;
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
        monitor.progress.store(i + 1, Ordering::Relaxed);
        let due = pace * (i as u32 + 1);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            thread::sleep(wait);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    // One more stats line after the last run.
    thread::sleep(Duration::from_secs(11));
    let report = monitor.report.clone();
    let series = monitor.stop()?;
    let mut v = Verdict::default();
    v.say(format!(
        "soak {name}: {} runs of {PYTHON} -c pass in {secs:.0} s; load average {}",
        args.runs,
        series.load_summary()
    ));
    rss_verdict(
        &mut v,
        name,
        &series,
        args,
        |s| s.progress >= WARMUP,
        "after 25 processes",
    );
    live_verdict(&mut v, name, &series, args);
    losses_line(&mut v, name, &report)?;
    Ok(v)
}

/// RSS at the start, at the end of the warm-up (the first sample for
/// which `warm` holds), its peak after and at the end; fails when the
/// peak exceeds the warm-up sample by more than the bound.
fn rss_verdict(
    v: &mut Verdict,
    name: &str,
    series: &Series,
    args: &SoakArgs,
    warm: impl Fn(&monitor::RssSample) -> bool,
    warm_label: &str,
) {
    let rss = &series.rss;
    let (Some(first), Some(last)) = (rss.first(), rss.last()) else {
        v.check(false, format!("soak {name}: no RSS sample"));
        return;
    };
    let minute = warmup(args);
    let mib = |kib: u64| kib as f64 / 1024.0;
    let at_minute = rss.iter().find(|s| s.secs >= minute);
    let Some(base_at) = rss.iter().position(&warm) else {
        v.check(false, format!("soak {name}: no RSS sample {warm_label}"));
        return;
    };
    let base = rss[base_at].rss_kib;
    let peak = rss[base_at..]
        .iter()
        .map(|s| s.rss_kib)
        .max()
        .unwrap_or(base);
    let growth = mib(peak.saturating_sub(base));
    let minute_label = format!("after {minute:.0} s");
    let at_minute = match at_minute {
        _ if warm_label == minute_label => String::new(),
        Some(s) => format!(", {minute_label} {:.1}", mib(s.rss_kib)),
        None => format!(", {minute_label} -"),
    };
    v.say(format!(
        "soak {name}: tracer RSS MiB: start {:.1}, {warm_label} {:.1}{at_minute}, end {:.1} \
         (peak after warm-up {:.1})",
        mib(first.rss_kib),
        mib(base),
        mib(last.rss_kib),
        mib(peak),
    ));
    if let Some(kib) = series.peak_kib {
        v.say(format!(
            "soak {name}: tracer peak RSS, the final report included: {:.1} MiB (not bounded)",
            mib(kib)
        ));
    }
    v.check(
        growth <= args.max_growth_mib as f64,
        format!(
            "soak {name}: RSS growth {warm_label} {growth:.1} MiB (bound {} MiB)",
            args.max_growth_mib
        ),
    );
}

/// The LIVE map's entries from the stats lines: after the first minute,
/// its peak after and at the end; fails past the bound.
fn live_verdict(v: &mut Verdict, name: &str, series: &Series, args: &SoakArgs) {
    let minute = warmup(args);
    let stats = &series.stats;
    let Some(base_at) = stats.iter().position(|s| s.secs >= minute) else {
        v.check(
            false,
            format!("soak {name}: no stats line after {minute:.0} s"),
        );
        return;
    };
    let base = stats[base_at].live;
    let peak = stats[base_at..]
        .iter()
        .map(|s| s.live)
        .max()
        .unwrap_or(base);
    let end = stats.last().map_or(base, |s| s.live);
    let tracked = stats[base_at..]
        .iter()
        .map(|s| s.tracked)
        .max()
        .unwrap_or(0);
    let events = stats.iter().map(|s| s.events_per_sec).fold(0.0, f64::max);
    v.say(format!(
        "soak {name}: LIVE map entries: after {minute:.0} s {base}, peak after {peak}, \
         last stats line {end}; processes tracked at most {tracked}; events/s at most {events:.0}"
    ));
    v.check(
        peak.saturating_sub(base) <= args.max_live_growth,
        format!(
            "soak {name}: LIVE map growth after {minute:.0} s {} entries (bound {})",
            peak.saturating_sub(base),
            args.max_live_growth
        ),
    );
}

/// The report's loss counters, said.
fn losses_line(v: &mut Verdict, name: &str, report: &Path) -> Result<serde_json::Value> {
    let losses = read_report(report)?["losses"].clone();
    v.say(format!("soak {name}: loss counters {losses}"));
    Ok(losses)
}

fn read_report(path: &Path) -> Result<serde_json::Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The lock the integration tests' system-wide tracers take
/// (tests/integration/harness.rs): concurrent system-wide tracers hook each
/// other and slow every attach, so they take turns, on this machine.
fn system_wide_lock() -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    const LOCK: &str = "/tmp/memtrace-bpf-system-wide-tests.lock";
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    println!("soak: waiting for {LOCK} (system-wide tests running elsewhere hold it)");
    // SAFETY: flock on a descriptor this function owns; the lock goes when
    // the returned file is closed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {LOCK}"));
    }
    Ok(file)
}
