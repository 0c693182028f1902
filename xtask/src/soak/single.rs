//! The single-process soak: tests/targets/soak_leak.c churns at `--rate`
//! allocations per second and leaks `--leak` bytes per second in
//! `--leak-block` blocks for `--seconds`, traced with `--pid` at the
//! default sample rate. Passes when the tracer's RSS is flat after the
//! first minute, the in-use bytes the report puts at `leak_block` are
//! within LEAK_TOLERANCE of what the target says it leaked, and no loss
//! counter is set that sampling does not explain.

use std::{
    io::{BufRead as _, BufReader, Lines, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use anyhow::{bail, Context, Result};

use super::{monitor::Monitor, read_report, rss_verdict, warmup, SoakArgs, Verdict};
use crate::cmd::{repo_root, target_dir};

/// The leak's estimate may be off by this much (a fraction): at the
/// default sample rate 60 MiB of 4 KiB blocks is about 960 samples, a
/// relative error of about 3 %.
const LEAK_TOLERANCE: f64 = 0.15;
/// Counters sampling explains: frees of blocks allocated before the trace
/// or not sampled, and returns whose entry came before the attach.
const EXPLAINED: &[&str] = &[
    "unknown_frees",
    "unknown_free_bytes",
    "return_without_entry",
];

pub fn soak(args: &SoakArgs, bin: &Path) -> Result<Verdict> {
    let name = "single";
    let (mut child, mut stdin, mut lines) = start([
        args.rate,
        u64::from(args.threads),
        args.leak,
        args.leak_block,
        args.seconds,
    ])?;
    let pid = child.id().to_string();
    let monitor = Monitor::start(bin, name, &["--pid", &pid], &args.tracer_args, args.every)?;
    writeln!(stdin, "go").context("starting the target's run")?;
    let counts = expect_line(&mut lines, "allocs ")?;
    expect_line(&mut lines, "done")?;
    let report = monitor.report.clone();
    let series = monitor.stop()?;
    drop(stdin);
    let _ = child.wait();
    let (allocs, rate, leaked) = parse_counts(&counts)?;
    let mut v = Verdict::default();
    v.say(format!(
        "soak {name}: {allocs} allocations in {} s, {rate:.0}/s ({} asked, {} threads); \
         load average {}",
        args.seconds,
        args.rate,
        args.threads,
        series.load_summary()
    ));
    let minute = warmup(args);
    rss_verdict(
        &mut v,
        name,
        &series,
        args,
        |s| s.secs >= minute,
        &format!("after {minute:.0} s"),
    );
    let stats = &series.stats;
    v.say(format!(
        "soak {name}: LIVE map entries (stats lines): {}",
        stats
            .iter()
            .map(|s| s.live.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    ));
    let json = read_report(&report)?;
    let found = leak_inuse(&json);
    let error = (found - leaked as f64) / leaked as f64;
    v.check(
        error.abs() <= LEAK_TOLERANCE,
        format!(
            "soak {name}: leak: target leaked {leaked} bytes, report has {found:.0} in use at \
             leak_block: {:+.2} % (bound {:.0} %)",
            error * 100.0,
            LEAK_TOLERANCE * 100.0
        ),
    );
    let losses = &json["losses"];
    let unexplained = losses.as_object().is_some_and(|m| {
        m.iter()
            .any(|(k, n)| !EXPLAINED.contains(&k.as_str()) && n.as_u64() != Some(0))
    });
    v.check(
        !unexplained,
        format!("soak {name}: loss counters {losses} (only {EXPLAINED:?} may be non-zero)"),
    );
    Ok(v)
}

/// soak_leak built and started with RATE THREADS LEAK BLOCK SECONDS,
/// once it said "ready": the process, its stdin and its output's lines.
pub(super) fn start(
    numbers: [u64; 5],
) -> Result<(Child, ChildStdin, Lines<BufReader<ChildStdout>>)> {
    let target = compile()?;
    let mut child = Command::new(&target)
        .args(numbers.map(|n| n.to_string()))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", target.display()))?;
    let stdin = child.stdin.take().context("target stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("target stdout")?).lines();
    expect_line(&mut lines, "ready")?;
    Ok((child, stdin, lines))
}

fn compile() -> Result<PathBuf> {
    let src = repo_root().join("tests/targets/soak_leak.c");
    let out = target_dir().join("soak/soak_leak");
    std::fs::create_dir_all(target_dir().join("soak")).context("creating target/soak")?;
    crate::cmd::run(
        Command::new("cc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&out)
            .arg(&src),
    )?;
    Ok(out)
}

/// Reads the target's lines until one starting with `prefix`.
fn expect_line(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    prefix: &str,
) -> Result<String> {
    for line in lines.by_ref() {
        let line = line.context("reading the target's output")?;
        if line.starts_with(prefix) {
            return Ok(line);
        }
    }
    bail!("the target ended before printing {prefix:?}")
}

/// `allocs N rate R/s leaked B bytes in K blocks` -> (N, R, B).
fn parse_counts(line: &str) -> Result<(u64, f64, u64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |key: &str| -> Option<&str> {
        let at = words.iter().position(|w| *w == key)?;
        words.get(at + 1).copied()
    };
    let parsed = (|| {
        Some((
            field("allocs")?.parse().ok()?,
            field("rate")?.trim_end_matches("/s").parse().ok()?,
            field("leaked")?.parse().ok()?,
        ))
    })();
    parsed.with_context(|| format!("unexpected target line {line:?}"))
}

/// In-use bytes of the stacks that pass through `leak_block`. A stack's
/// `frames` are indices into the report's `frames` table (format 2).
fn leak_inuse(report: &serde_json::Value) -> f64 {
    let table = &report["frames"];
    report["stacks"]
        .as_array()
        .map(|stacks| {
            stacks
                .iter()
                .filter(|s| {
                    s["frames"].as_array().is_some_and(|f| {
                        f.iter()
                            .filter_map(serde_json::Value::as_u64)
                            .any(|i| table[i as usize]["function"].as_str() == Some("leak_block"))
                    })
                })
                .filter_map(|s| s["inuse_bytes"].as_f64())
                .sum()
        })
        .unwrap_or(0.0)
}
