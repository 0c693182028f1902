//! `cargo xtask bench-report`: how long the report of many distinct stacks
//! takes and how much memory the tracer needs for it, issue #21's case:
//! bench/many_stacks.c makes 100,000 allocations, each from its own
//! 17-frame stack, traced in exact mode with the default unwinding
//! (tables) and the default ring buffer; the tracer is stopped with SIGINT
//! and timed until it exits, once per format, then once more in DWARF mode
//! (text) for comparison. Peak RSS is the tracer's own over the whole trace
//! (getrusage of the reaped child), so it includes the report; the peak
//! before SIGINT (VmHWM) says how much of it the trace itself needed. The
//! CPU seconds the tracer spent from SIGINT to exit are shown too: on a
//! busy machine they vary less than the wall time.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::{repo_root, run as run_cmd, target_dir};
use crate::cpu::cpu_secs;

/// Calls between main and the allocating leaf: 12 + 5 = 17 frames.
const LEVELS: u32 = 12;
/// Distinct stacks (at most 3^LEVELS).
const STACKS: u32 = 100_000;

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
        "{STACKS} distinct stacks of {} frames, exact mode; load average {}:",
        LEVELS + 5,
        load_average()
    );
    println!(
        "{:<7} {:<10} {:>9} {:>7} {:>9} {:>13} {:>9} {:>6}  rendering alone (--verbose)",
        "unwind", "format", "report s", "CPU s", "peak MiB", "before report", "file MiB", "lost"
    );
    let runs = [
        ("tables", "text"),
        ("tables", "collapsed"),
        ("tables", "json"),
        ("tables", "pprof"),
        ("dwarf", "text"),
    ];
    for (unwind, format) in runs {
        let Run {
            secs,
            cpu_secs,
            peak_kib,
            traced_peak_kib,
            lost,
            render,
        } = one(&tracer, &target, unwind, format)?;
        let file_mib = std::fs::metadata(report_path(format))?.len() as f64 / (1024.0 * 1024.0);
        println!(
            "{unwind:<7} {format:<10} {secs:>9.2} {cpu_secs:>7.2} {:>9} {:>13} {file_mib:>9.1} \
             {lost:>6}  {render}",
            peak_kib / 1024,
            traced_peak_kib / 1024,
        );
    }
    println!("load average {}", load_average());
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// VmHWM of `pid` in KiB (/proc/PID/status), 0 when unreadable.
fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// What one trace measured.
struct Run {
    /// Wall-clock seconds from SIGINT to exit.
    secs: f64,
    /// The tracer's CPU seconds (user + system) in that time.
    cpu_secs: f64,
    peak_kib: u64,
    /// Its peak before SIGINT: what the trace needed, the report left out.
    traced_peak_kib: u64,
    lost: u64,
    /// The tracer's own line on what rendering took.
    render: String,
}

/// One trace, stopped with SIGINT once the target has allocated.
fn one(
    tracer: &std::path::Path,
    target: &std::path::Path,
    unwind: &str,
    format: &str,
) -> Result<Run> {
    let mut t = Command::new(target)
        .args([LEVELS.to_string(), STACKS.to_string()])
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
            "--unwind",
            unwind,
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
    let traced_peak_kib = vm_hwm_kib(tr.id());
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
        traced_peak_kib,
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
