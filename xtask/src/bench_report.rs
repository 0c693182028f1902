//! `cargo xtask bench-report`: how long the report of many distinct stacks
//! takes and how much memory the tracer needs for it. bench/many_stacks.c
//! makes 2^17 allocations, each from its own 40-frame stack (DWARF, exact
//! mode, the default ring buffer); the tracer is stopped with SIGINT and
//! timed until it exits, once per format. Peak RSS is the tracer's own
//! (getrusage of the reaped child), so it includes the report. The CPU
//! seconds the tracer spent from SIGINT to exit are shown too: on a busy
//! machine they vary less than the wall time.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::{repo_root, run as run_cmd, target_dir};
use crate::cpu::cpu_secs;

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
        "{:<10} {:>10} {:>10} {:>14} {:>10} {:>12}  rendering alone (--verbose)",
        "format", "report s", "CPU s", "peak RSS MiB", "file MiB", "lost events"
    );
    for format in ["text", "collapsed", "json", "pprof"] {
        let Run {
            secs,
            cpu_secs,
            peak_kib,
            lost,
            render,
        } = one(&tracer, &target, format)?;
        let file_mib = std::fs::metadata(report_path(format))?.len() as f64 / (1024.0 * 1024.0);
        println!(
            "{format:<10} {secs:>10.2} {cpu_secs:>10.2} {:>14} {file_mib:>10.1} {lost:>12}  {render}",
            peak_kib / 1024
        );
    }
    Ok(())
}

/// What one trace measured.
struct Run {
    /// Wall-clock seconds from SIGINT to exit.
    secs: f64,
    /// The tracer's CPU seconds (user + system) in that time.
    cpu_secs: f64,
    peak_kib: u64,
    lost: u64,
    /// The tracer's own line on what rendering took.
    render: String,
}

/// One trace, stopped with SIGINT once the target has allocated.
fn one(tracer: &std::path::Path, target: &std::path::Path, format: &str) -> Result<Run> {
    let mut t = Command::new(target)
        .arg(LEVELS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting many_stacks")?;
    let mut t_out = BufReader::new(t.stdout.take().context("stdout")?);
    let mut line = String::new();
    t_out.read_line(&mut line)?;
    let out_path = report_path(format);
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
    let cpu_before = cpu_secs(tr.id()).context("reading the tracer's CPU time")?;
    let start = Instant::now();
    // SAFETY: kill sends a signal to our own child.
    unsafe { libc::kill(tr.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    let reaped = wait4(tr.id())?;
    let secs = start.elapsed().as_secs_f64();
    drop(stdin);
    let _ = t.wait();
    if !reaped.ok {
        bail!("the tracer failed: {rest}");
    }
    let lost = if format == "json" {
        // Format memtrace-bpf/2: frames are a table; losses read as before.
        let text = std::fs::read_to_string(&out_path)?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", out_path.display()))?;
        if v["format"] != "memtrace-bpf/2" {
            bail!("unexpected report format {}", v["format"]);
        }
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
    Ok(Run {
        secs,
        cpu_secs: reaped.cpu_secs - cpu_before,
        peak_kib: reaped.peak_kib,
        lost,
        render,
    })
}

/// Where the report in `format` is written.
fn report_path(format: &str) -> std::path::PathBuf {
    target_dir().join(format!("bench/many_stacks.{format}"))
}

/// A reaped child.
struct Reaped {
    /// It exited with status 0.
    ok: bool,
    /// User + system CPU seconds over its life.
    cpu_secs: f64,
    peak_kib: u64,
}

/// Reaps `pid`.
fn wait4(pid: u32) -> Result<Reaped> {
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: waits for our own child; fills the status and rusage we pass.
    let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, usage.as_mut_ptr()) };
    if rc != pid as libc::pid_t {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    // SAFETY: initialized by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Reaped {
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        cpu_secs: secs(usage.ru_utime) + secs(usage.ru_stime),
        peak_kib: usage.ru_maxrss as u64,
    })
}
