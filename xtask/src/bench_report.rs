//! `cargo xtask bench-report`: how long the report of many distinct stacks
//! takes and how much memory the tracer needs for it:
//! bench/many_stacks.c makes 100,000 allocations, each from its own
//! 17-frame stack, traced in exact mode with the default unwinding
//! (tables) and the default ring buffer; the tracer is stopped with SIGINT
//! and timed until it exits, once per format, then once more in DWARF mode
//! (text) for comparison. Peak RSS is the tracer's own over the whole trace
//! (getrusage of the reaped child), so it includes the report; the peak
//! before SIGINT (VmHWM) says how much of it the trace itself needed. The
//! CPU seconds the tracer spent from SIGINT to exit are shown too: on a
//! busy machine they vary less than the wall time.
//!
//! `--runs N` traces each case N times, the cases interleaved (round
//! robin: a busy spell of the machine hits them all alike), and ends with
//! the medians; `--tracer PATH` (repeatable) compares binaries the same
//! way; `--count-mallocs` counts the tracer's malloc, calloc and realloc
//! calls from SIGINT to exit with perf's uprobes on the tracer alone (each
//! call then traps, as under another tracer's uprobes: times run slower).

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
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
/// libc's allocating functions counted by --count-mallocs.
const MALLOC_PROBES: [&str; 3] = ["malloc", "calloc", "realloc"];
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

#[derive(clap::Args)]
pub struct BenchReportArgs {
    /// Traces per case; with more than one, the cases are interleaved and
    /// the medians shown at the end.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Report formats traced with tables unwinding (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "text,collapsed,json,pprof"
    )]
    formats: Vec<String>,
    /// Leave out the DWARF-mode run (text).
    #[arg(long)]
    no_dwarf: bool,
    /// Time these tracer binaries instead of building the release one
    /// (repeatable: compared run for run).
    #[arg(long)]
    tracer: Vec<PathBuf>,
    /// Count the tracer's allocator calls from SIGINT to exit (perf uprobes
    /// on libc's malloc, calloc and realloc in the tracer only).
    #[arg(long)]
    count_mallocs: bool,
}

pub fn run(args: &BenchReportArgs) -> Result<()> {
    crate::setup::run()?;
    let tracers = match args.tracer.is_empty() {
        true => {
            crate::build_release()?;
            vec![target_dir().join("release/memtrace-bpf")]
        }
        false => args.tracer.clone(),
    };
    let target = target_dir().join("bench/many_stacks");
    std::fs::create_dir_all(target_dir().join("bench"))?;
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-g", "-o"])
            .arg(&target)
            .arg(repo_root().join("bench/many_stacks.c")),
    )?;
    let _probes = match args.count_mallocs {
        true => Some(MallocProbes::add()?),
        false => None,
    };
    let mut cases: Vec<(&Path, &str, &str)> = Vec::new();
    for tracer in &tracers {
        for format in &args.formats {
            cases.push((tracer, "tables", format));
        }
        if !args.no_dwarf {
            cases.push((tracer, "dwarf", "text"));
        }
    }
    println!(
        "{STACKS} distinct stacks of {} frames, exact mode; load average {}:",
        LEVELS + 5,
        load_average()
    );
    println!(
        "{:<12} {:<7} {:<10} {:>9} {:>7} {:>9} {:>13} {:>9} {:>6} {:>8}  rendering alone (--verbose)",
        "tracer",
        "unwind",
        "format",
        "report s",
        "CPU s",
        "peak MiB",
        "before report",
        "file MiB",
        "lost",
        "mallocs"
    );
    let mut results: Vec<Vec<Run>> = cases.iter().map(|_| Vec::new()).collect();
    for _ in 0..args.runs.max(1) {
        for (i, &(tracer, unwind, format)) in cases.iter().enumerate() {
            let r = one(tracer, &target, unwind, format, args.count_mallocs)?;
            let file_mib = std::fs::metadata(report_path(format))?.len() as f64 / (1024.0 * 1024.0);
            println!(
                "{:<12} {unwind:<7} {format:<10} {:>9.2} {:>7.2} {:>9} {:>13} {file_mib:>9.1} \
                 {:>6} {:>8}  {}",
                label(tracer),
                r.secs,
                r.cpu_secs,
                r.peak_kib / 1024,
                r.traced_peak_kib / 1024,
                r.lost,
                r.mallocs.map_or("-".into(), |n| n.to_string()),
                r.render,
            );
            println!("    {}", r.phases);
            results[i].push(r);
        }
    }
    if args.runs > 1 {
        println!("medians of {} runs (peak: the largest):", args.runs);
        for ((tracer, unwind, format), runs) in cases.iter().zip(&results) {
            let med = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
            println!(
                "{:<12} {unwind:<7} {format:<10} report {:.2} s (CPU {:.2} s), peak {} MiB{}",
                label(tracer),
                med(|r| r.secs),
                med(|r| r.cpu_secs),
                runs.iter().map(|r| r.peak_kib).max().unwrap_or(0) / 1024,
                match runs[0].mallocs {
                    Some(_) => format!(", {:.0} mallocs", med(|r| r.mallocs.unwrap_or(0) as f64)),
                    None => String::new(),
                }
            );
        }
    }
    println!("load average {}", load_average());
    Ok(())
}

/// A tracer binary as the table names it: its file name.
fn label(tracer: &Path) -> String {
    tracer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// perf's uprobe events on libc's allocating functions, defined for
/// --count-mallocs and deleted when dropped (they trap only in the
/// processes `perf stat -p` watches).
struct MallocProbes;

impl MallocProbes {
    fn add() -> Result<MallocProbes> {
        let mut cmd = Command::new("perf");
        cmd.args(["probe", "-q", "-x", LIBC]);
        for f in MALLOC_PROBES {
            cmd.args(["-a", f]);
        }
        run_cmd(&mut cmd).context("perf probe (is perf installed?)")?;
        Ok(MallocProbes)
    }
}

impl Drop for MallocProbes {
    fn drop(&mut self) {
        for f in MALLOC_PROBES {
            let _ = Command::new("perf")
                .args(["probe", "-q", "-d", &format!("probe_libc:{f}")])
                .status();
        }
    }
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
    /// Its line on each step after the trace (--verbose).
    phases: String,
    /// Allocator calls from SIGINT to exit (--count-mallocs).
    mallocs: Option<u64>,
}

/// One trace, stopped with SIGINT once the target has allocated.
fn one(tracer: &Path, target: &Path, unwind: &str, format: &str, count: bool) -> Result<Run> {
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
    let mut tr = start_tracer(tracer, t.id(), unwind, format, &out_path)?;
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
    let counter = match count {
        true => Some(MallocCount::start(tr.id())?),
        false => None,
    };
    let cpu_before = cpu_secs(tr.id()).context("reading the tracer's CPU time")?;
    let start = Instant::now();
    // SAFETY: kill sends a signal to our own child.
    unsafe { libc::kill(tr.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    let reaped = wait4(tr.id())?;
    let secs = start.elapsed().as_secs_f64();
    let mallocs = counter.map(MallocCount::finish).transpose()?;
    drop(stdin);
    let _ = t.wait();
    if !reaped.ok {
        bail!("the tracer failed: {rest}");
    }
    let lost = lost_events(format, &out_path, &rest)?;
    let render = rest
        .lines()
        .find_map(|l| l.strip_prefix("memtrace-bpf: report rendered in "))
        .unwrap_or("?")
        .to_string();
    let phases = rest
        .lines()
        .find_map(|l| l.strip_prefix("memtrace-bpf: after the trace: "))
        .unwrap_or("?")
        .to_string();
    Ok(Run {
        secs,
        cpu_secs: reaped.cpu_secs - cpu_before,
        peak_kib: reaped.peak_kib,
        traced_peak_kib,
        lost,
        render,
        phases,
        mallocs,
    })
}

/// `memtrace-bpf --pid PID --sample-rate 1 --unwind UNWIND --format FORMAT
/// --verbose -o OUT_PATH`, its stderr piped.
fn start_tracer(
    tracer: &Path,
    pid: u32,
    unwind: &str,
    format: &str,
    out_path: &Path,
) -> Result<std::process::Child> {
    Command::new(tracer)
        .args([
            "--pid",
            &pid.to_string(),
            "--sample-rate",
            "1",
            "--unwind",
            unwind,
            "--format",
            format,
            "--verbose",
            "-o",
        ])
        .arg(out_path)
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the tracer")
}

/// Events the ring buffer dropped (`ringbuf_full`), from the report at
/// `out_path` or the tracer's stderr, `rest`.
fn lost_events(format: &str, out_path: &Path, rest: &str) -> Result<u64> {
    Ok(if format == "json" {
        // Format memtrace-bpf/2: frames are a table; losses read as before.
        // Only those two fields are kept: a 32 MiB report read whole into
        // a `Value` took 350 MiB here, and the next child started by
        // posix_spawn inherits that high-water mark as its ru_maxrss (the
        // kernel keeps the mm's at exec), so every later peak read 379 MiB.
        #[derive(serde::Deserialize)]
        struct Head {
            format: String,
            losses: Losses,
        }
        #[derive(serde::Deserialize)]
        struct Losses {
            ringbuf_full: u64,
        }
        let file = std::fs::File::open(out_path)?;
        let head: Head = serde_json::from_reader(std::io::BufReader::new(file))
            .with_context(|| format!("{} is not JSON", out_path.display()))?;
        if head.format != "memtrace-bpf/2" {
            bail!("unexpected report format {}", head.format);
        }
        head.losses.ringbuf_full
    } else {
        // Text has them in the report, collapsed and pprof on stderr.
        let text = match format {
            "text" => std::fs::read_to_string(out_path)?,
            _ => rest.to_string(),
        };
        text.lines()
            .find(|l| l.trim_start().starts_with("ringbuf_full"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    })
}

/// `perf stat` counting a process's allocator calls until it exits.
struct MallocCount {
    perf: std::process::Child,
    out: PathBuf,
}

impl MallocCount {
    fn start(pid: u32) -> Result<MallocCount> {
        let out = target_dir().join("bench/mallocs.csv");
        let events: Vec<String> = MALLOC_PROBES
            .iter()
            .map(|f| format!("probe_libc:{f}"))
            .collect();
        let perf = Command::new("perf")
            .args(["stat", "-x", ",", "-e", &events.join(","), "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&out)
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf stat")?;
        // perf attaches in a moment: the report starts after it.
        std::thread::sleep(Duration::from_millis(500));
        Ok(MallocCount { perf, out })
    }

    /// The calls counted (perf ends with the process).
    fn finish(mut self) -> Result<u64> {
        self.perf.wait()?;
        let text = std::fs::read_to_string(&self.out)?;
        Ok(text
            .lines()
            .filter(|l| l.contains("probe_libc:"))
            .filter_map(|l| l.split(',').next()?.parse::<u64>().ok())
            .sum())
    }
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
