//! `cargo xtask kernels [KERNEL...]`: boots Debian's kernel packages in
//! QEMU (virtme-ng over the host's root) and runs the same few traces on
//! each; the host judges what the guests leave. docs/kernels.md.

mod apt;
mod debver;
mod guest;
mod judge;
mod table;
#[cfg(test)]
mod tests;

use std::{fs, path::Path, time::Duration};

use anyhow::{bail, Result};

use crate::cmd::target_dir;
use judge::{judge, Raw, CHECKS};
use table::KernelRun;

/// A kernel of the matrix: the newest amd64 image package of `suites`
/// whose ABI starts with `series` (any for None).
pub struct Kernel {
    pub name: &'static str,
    pub suites: &'static [&'static str],
    pub series: Option<&'static str>,
}

/// The oldest kernel the tracer promises (DESIGN.md), two Debian stables
/// and whatever unstable has now.
pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "5.10",
        suites: &["bullseye", "bullseye-security"],
        series: Some("5.10"),
    },
    Kernel {
        name: "6.1",
        suites: &["bookworm", "bookworm-security"],
        series: Some("6.1"),
    },
    Kernel {
        name: "6.12",
        suites: &["trixie", "trixie-security"],
        series: Some("6.12"),
    },
    Kernel {
        name: "newest",
        suites: &["sid"],
        series: None,
    },
];

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// Kernels to boot (5.10, 6.1, 6.12, newest); all by default.
    pub kernels: Vec<String>,
    /// Trace with the release binary instead of the dev-profile one.
    #[arg(long)]
    pub release: bool,
    /// Seconds one guest may take, boot included, before it is killed.
    #[arg(long, default_value_t = GUEST_TIMEOUT)]
    pub timeout: u64,
    /// Seconds one check may take inside a guest.
    #[arg(long, default_value_t = CHECK_TIMEOUT)]
    pub check_timeout: u64,
}

/// Measured under TCG: a guest takes 1-4 minutes; these leave room for
/// a loaded host without letting a hung guest hold CI for long.
const GUEST_TIMEOUT: u64 = 600;
const CHECK_TIMEOUT: u64 = 180;

impl KernelsArgs {
    /// Every kernel, the dev binary, the default limits: what `cargo xtask
    /// test` runs.
    pub fn all() -> KernelsArgs {
        KernelsArgs {
            kernels: Vec::new(),
            release: false,
            timeout: GUEST_TIMEOUT,
            check_timeout: CHECK_TIMEOUT,
        }
    }
}

pub fn run(args: &KernelsArgs) -> Result<()> {
    let selected = select(&args.kernels)?;
    crate::setup::for_kernels()?;
    let dir = target_dir().join("kernels");
    let venv = dir.join("venv");
    let programs = guest::build(&dir, args.release)?;
    let apt = apt::Apt::new(dir.join("apt"));
    apt.update()?;
    let candidates = apt.candidates()?;
    let limits = (
        Duration::from_secs(args.timeout),
        Duration::from_secs(args.check_timeout),
    );
    let mut accel = None;
    let mut runs = Vec::new();
    for kernel in selected {
        let Some(chosen) = apt::pick_newest(kernel, &candidates) else {
            runs.push(failed(
                kernel,
                "?",
                format!("no image package in {:?}", kernel.suites),
            ));
            continue;
        };
        let extracted = match apt.fetch(kernel, chosen, &dir.join("extract")) {
            Ok(e) => e,
            Err(e) => {
                runs.push(failed(kernel, &chosen.version, format!("download: {e:#}")));
                continue;
            }
        };
        println!(
            "{}: {} {}",
            kernel.name, extracted.package, extracted.version
        );
        let accel = *accel.get_or_insert_with(|| {
            let a = guest::probe_accel(&venv, &extracted.vmlinuz);
            println!("guests run with {a:?}");
            a
        });
        let results = dir.join("results").join(kernel.name);
        let scaled = scaled_limits(limits, crate::cpu::load_per_cpu());
        if scaled != limits {
            println!(
                "busy host: this guest may take {} s, a check {} s",
                scaled.0.as_secs(),
                scaled.1.as_secs()
            );
        }
        let run = boot_and_judge(kernel, &extracted, accel, &programs, &results, scaled)?;
        print!("{}", table::console(&run));
        runs.push(run);
    }
    finish(&dir, &runs)
}

/// The limits for a guest about to boot on a host `load` busy (the 1-minute
/// load average per CPU): a TCG guest runs on one host thread, which a
/// busy host gives a share of a CPU, so a guest and its checks take longer
/// by about as much. Scaled by the load, at most `MAX_LOAD_SCALE` times: a
/// verification stuck at the verifier's limit still ends in a timeout.
fn scaled_limits(limits: (Duration, Duration), load: f64) -> (Duration, Duration) {
    let factor = load.clamp(1.0, MAX_LOAD_SCALE);
    (limits.0.mul_f64(factor), limits.1.mul_f64(factor))
}

const MAX_LOAD_SCALE: f64 = 4.0;

fn select(names: &[String]) -> Result<Vec<&'static Kernel>> {
    if names.is_empty() {
        return Ok(KERNELS.iter().collect());
    }
    names
        .iter()
        .map(|n| {
            KERNELS.iter().find(|k| k.name == n).ok_or_else(|| {
                let known: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
                anyhow::anyhow!("unknown kernel {n:?}; known: {}", known.join(", "))
            })
        })
        .collect()
}

fn failed(kernel: &Kernel, release: &str, problem: String) -> KernelRun {
    KernelRun {
        name: kernel.name.to_owned(),
        release: release.to_owned(),
        seconds: 0,
        problem: Some(problem),
        checks: Vec::new(),
    }
}

fn boot_and_judge(
    kernel: &Kernel,
    extracted: &apt::Extracted,
    accel: guest::Accel,
    programs: &guest::Programs,
    results: &Path,
    limits: (Duration, Duration),
) -> Result<KernelRun> {
    if results.exists() {
        fs::remove_dir_all(results)?;
    }
    fs::create_dir_all(results)?;
    let venv = target_dir().join("kernels/venv");
    let (end, took) = guest::boot(&venv, &extracted.vmlinuz, accel, programs, results, limits)?;
    let timed_out = matches!(end, guest::End::TimedOut);
    let read = |p: &Path| fs::read_to_string(p).ok();
    let release = read(&results.join("uname"))
        .map_or_else(|| extracted.version.clone(), |s| s.trim().to_owned());
    let checks = CHECKS
        .iter()
        .map(|check| {
            let d = results.join(check.name);
            let raw = Raw {
                exit: read(&d.join("exit")).and_then(|s| s.trim().parse().ok()),
                stderr: read(&d.join("stderr")).unwrap_or_default(),
                report: read(&d.join("report.json")),
                seconds: read(&d.join("seconds")).and_then(|s| s.trim().parse().ok()),
            };
            judge(check, &raw, timed_out)
        })
        .collect();
    let problem = if timed_out {
        Some(format!("guest timeout after {} s (killed)", took.as_secs()))
    } else if !results.join("finished").exists() {
        let console = read(&results.join("console.log")).unwrap_or_default();
        Some(format!(
            "the guest did not finish: {}",
            judge::last_lines(&console)
        ))
    } else {
        None
    };
    Ok(KernelRun {
        name: kernel.name.to_owned(),
        release,
        seconds: took.as_secs(),
        problem,
        checks,
    })
}

fn finish(dir: &Path, runs: &[KernelRun]) -> Result<()> {
    let md = table::markdown(runs);
    fs::write(dir.join("report.md"), &md)?;
    println!("\n{md}\n(target/kernels/report.md)");
    let failing: Vec<&str> = runs
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.name.as_str())
        .collect();
    if !failing.is_empty() {
        bail!("kernel matrix FAILED on: {}", failing.join(", "));
    }
    println!("kernel matrix passed on every kernel");
    Ok(())
}
