//! `cargo xtask bench-report`: how long the report of many distinct stacks
//! takes and how much memory the tracer needs for it. bench/many_stacks.c
//! makes 2^17 allocations, each from its own 40-frame stack (DWARF, exact
//! mode, the default ring buffer); the tracer is stopped with SIGINT and
//! timed until it exits, once per format. Peak RSS is the tracer's own
//! (getrusage of the reaped child), so it includes the report.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::{repo_root, run as run_cmd, target_dir};

const LEVELS: u32 = 17;

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::build_release()?;
    let tracer = target_dir().join("release/memtrace-bpf");
    let target = target_dir().join("bench/many_stacks");
    std::fs::create_dir_all(target_dir().join("bench"))?;
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-g", "-o"])
            .arg(&target)
            .arg(repo_root().join("bench/many_stacks.c")),
    )?;
    println!(
        "{} distinct stacks of about 40 frames, exact mode:",
        1u32 << LEVELS
    );
    println!(
        "{:<10} {:>10} {:>14} {:>12}  rendering alone (--verbose)",
        "format", "report s", "peak RSS MiB", "lost events"
    );
    for format in ["text", "collapsed", "json", "pprof"] {
        let (secs, peak_kib, lost, render) = one(&tracer, &target, format)?;
        println!(
            "{format:<10} {secs:>10.2} {:>14} {lost:>12}  {render}",
            peak_kib / 1024
        );
    }
    Ok(())
}

/// One trace: seconds from SIGINT to exit, peak RSS (KiB), lost events,
/// and the tracer's own line on what rendering took.
fn one(
    tracer: &std::path::Path,
    target: &std::path::Path,
    format: &str,
) -> Result<(f64, u64, u64, String)> {
    let mut t = Command::new(target)
        .arg(LEVELS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting many_stacks")?;
    let mut t_out = BufReader::new(t.stdout.take().context("stdout")?);
    let mut line = String::new();
    t_out.read_line(&mut line)?;
    let out_path = target_dir().join(format!("bench/many_stacks.{format}"));
    let mut tr = Command::new(tracer)
        .args([
            "--pid",
            &t.id().to_string(),
            "--sample-rate",
            "1",
            "--format",
            format,
            "--verbose",
            "-o",
        ])
        .arg(&out_path)
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the tracer")?;
    let mut err = BufReader::new(tr.stderr.take().context("stderr")?);
    loop {
        line.clear();
        if err.read_line(&mut line)? == 0 {
            bail!("the tracer exited before tracing");
        }
        if line.contains("tracing") {
            break;
        }
    }
    let mut stdin = t.stdin.take().context("stdin")?;
    stdin.write_all(b"go\n")?;
    stdin.flush()?;
    line.clear();
    t_out.read_line(&mut line)?;
    // Let the tracer catch up with the burst before it is stopped.
    std::thread::sleep(Duration::from_secs(2));
    let start = Instant::now();
    // SAFETY: kill sends a signal to our own child.
    unsafe { libc::kill(tr.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    let status = wait4(tr.id())?;
    let secs = start.elapsed().as_secs_f64();
    drop(stdin);
    let _ = t.wait();
    if !status.0 {
        bail!("the tracer failed: {rest}");
    }
    let lost = if format == "json" {
        let v: serde_json::Value = serde_json::from_reader(std::fs::File::open(&out_path)?)?;
        v["losses"]["ringbuf_full"].as_u64().unwrap_or(0)
    } else {
        // Text has them in the report, collapsed and pprof on stderr.
        let text = match format {
            "text" => std::fs::read_to_string(&out_path)?,
            _ => rest.clone(),
        };
        text.lines()
            .find(|l| l.trim_start().starts_with("ringbuf_full"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    let render = rest
        .lines()
        .find_map(|l| l.strip_prefix("memtrace-bpf: report rendered in "))
        .unwrap_or("?")
        .to_string();
    Ok((secs, status.1, lost, render))
}

/// Reaps `pid`: (exited with 0, its peak RSS in KiB).
fn wait4(pid: u32) -> Result<(bool, u64)> {
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: waits for our own child; fills the status and rusage we pass.
    let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, usage.as_mut_ptr()) };
    if rc != pid as libc::pid_t {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    // SAFETY: initialized by the successful call above.
    let usage = unsafe { usage.assume_init() };
    Ok((
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        usage.ru_maxrss as u64,
    ))
}
