//! The agent soak: `memtrace-bpf agent` for `--seconds` with a trigger that
//! fires about once a minute (soak_leak's RSS above 1 MiB, which always
//! holds; each trace `seconds=10`, `cooldown=60`) while soak_leak churns
//! and leaks slowly. The agent's and its standby tracer's VmRSS are
//! sampled every `--every` seconds. Passes when the agent stays under
//! MAX_AGENT_MIB, its RSS is flat after the warm-up (within
//! `--max-growth-mib`), the trigger fired about once a minute and every
//! trace wrote its report.

use std::{
    io::Write as _,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{monitor::vm_rss_kib, warmup, SoakArgs, Verdict};
use crate::{
    bench_proc::{get_unix, json_u64},
    cmd::target_dir,
};

/// The bound for an agent, idle or tracing.
const MAX_AGENT_MIB: f64 = 80.0;
/// soak_leak's load: allocations a second, and bytes leaked a second.
const RATE: u64 = 200_000;
const LEAK: u64 = 16 << 10;

pub fn soak(args: &SoakArgs, bin: &Path) -> Result<Verdict> {
    let dir = target_dir().join("soak/agent");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (mut child, mut stdin, _lines) =
        super::single::start([RATE, 1, LEAK, 4096, args.seconds + 60])?;
    writeln!(stdin, "go")?;
    let socket = dir.join("run/agent.sock");
    let trigger = format!("pid={} memory>1M seconds=10 cooldown=60", child.id());
    let mut agent = Command::new(bin)
        .args([
            "agent",
            "--serve",
            "off",
            "--max-reports",
            "20",
            "--trigger",
        ])
        .arg(&trigger)
        .arg("--socket")
        .arg(&socket)
        .arg("--dir")
        .arg(dir.join("traces"))
        .arg("--reports")
        .arg(dir.join("reports"))
        .stderr(std::fs::File::create(dir.join("agent.log"))?)
        .spawn()
        .context("starting the agent")?;
    let started = Instant::now();
    let mut samples: Vec<(f64, u64, Option<u64>)> = Vec::new();
    while started.elapsed() < Duration::from_secs(args.seconds) {
        thread::sleep(Duration::from_secs(args.every));
        let standby = get_unix(&socket, "/traces")
            .ok()
            .and_then(|a| standby_pid(&a));
        samples.push((
            started.elapsed().as_secs_f64(),
            vm_rss_kib(agent.id()).context("the agent ended")?,
            standby.and_then(vm_rss_kib),
        ));
    }
    let triggers = get_unix(&socket, "/triggers").unwrap_or_default();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.id() as libc::pid_t, libc::SIGTERM) };
    let status = agent.wait()?;
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let reports = std::fs::read_dir(dir.join("reports"))
        .map(|d| d.count())
        .unwrap_or(0);
    Ok(verdict(
        args,
        &samples,
        &triggers,
        reports,
        status.success(),
    ))
}

fn verdict(
    args: &SoakArgs,
    samples: &[(f64, u64, Option<u64>)],
    triggers: &str,
    reports: usize,
    stopped: bool,
) -> Verdict {
    let mut v = Verdict::default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    let warm = warmup(args);
    let after: Vec<u64> = samples
        .iter()
        .filter(|s| s.0 >= warm)
        .map(|s| s.1)
        .collect();
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(0);
    let (base, last) = (after.first().copied(), after.last().copied());
    let growth = mib(after
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .saturating_sub(base.unwrap_or(0)));
    let standby: Vec<u64> = samples.iter().filter_map(|s| s.2).collect();
    v.say(format!(
        "soak agent: agent RSS MiB: start {:.1}, after {warm:.0} s {:.1}, end {:.1}, peak {:.1}; \
         standby tracer RSS MiB: {:.1} to {:.1} ({} samples)",
        mib(samples.first().map_or(0, |s| s.1)),
        mib(base.unwrap_or(0)),
        mib(last.unwrap_or(0)),
        mib(peak),
        mib(standby.iter().min().copied().unwrap_or(0)),
        mib(standby.iter().max().copied().unwrap_or(0)),
        standby.len(),
    ));
    v.check(
        mib(peak) <= MAX_AGENT_MIB,
        format!("soak agent: RSS at most {MAX_AGENT_MIB} MiB"),
    );
    v.check(
        base.is_some() && growth <= args.max_growth_mib as f64,
        format!(
            "soak agent: RSS grew {growth:.1} MiB after the warm-up (at most {})",
            args.max_growth_mib
        ),
    );
    let fired = json_u64(triggers, "\"fired\"").unwrap_or(0);
    let minutes = args.seconds / 60;
    v.check(
        fired + 2 >= minutes,
        format!("soak agent: the trigger fired {fired} times in {minutes} minutes"),
    );
    v.check(
        reports as u64 >= fired.min(20).saturating_sub(1),
        format!("soak agent: {reports} reports kept (the newest 20 at most)"),
    );
    v.check(stopped, "soak agent: the agent stopped on SIGTERM".into());
    v
}

/// `"standby_pid": N` in GET /traces.
fn standby_pid(answer: &str) -> Option<u32> {
    json_u64(answer, "\"standby_pid\"").and_then(|p| u32::try_from(p).ok())
}
