//! A tracer under watch: its VmRSS sampled every few seconds, its
//! `--verbose` stats lines parsed, everything it says kept in a log file.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::cmd::target_dir;

pub struct RssSample {
    pub secs: f64,
    /// What the soak had done by then (python runs started).
    pub progress: u64,
    pub rss_kib: u64,
    /// The host's 1-minute load average.
    pub load: f64,
}

/// One `memtrace-bpf: [stats]` line.
pub struct StatsLine {
    pub secs: f64,
    pub live: u64,
    pub tracked: u64,
    pub events_per_sec: f64,
    /// `--unwind tables`: what the tables hold then.
    pub tables: Option<Tables>,
    /// What the soak had done by then (see `RssSample::progress`).
    pub progress: u64,
}

/// The stats line's `unwind tables F files R rows, M mappings of P
/// processes`, and the kernel's memory for the mappings (UNWIND_MAPPINGS,
/// the tracer's one LPM trie: `memlock` in its fdinfo) when read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tables {
    pub files: u64,
    pub rows: u64,
    pub mappings: u64,
    pub processes: u64,
    /// Of `files` and `rows`: the tables of files no process maps now.
    pub kept_files: u64,
    pub kept_rows: u64,
    pub trie_bytes: Option<u64>,
}

pub struct Series {
    pub rss: Vec<RssSample>,
    pub stats: Vec<StatsLine>,
    /// The tracer's own peak RSS (KiB), the final report included, from
    /// its `--verbose` "peak RSS" line.
    pub peak_kib: Option<u64>,
    /// `--unwind tables`: the tracer's final `unwind tables: ...` line
    /// (tables built, rows written, build time, kept tables reused).
    pub tables_summary: Option<String>,
}

impl Series {
    /// The load average over the run: mean and max.
    pub fn load_summary(&self) -> String {
        let n = self.rss.len().max(1) as f64;
        let mean = self.rss.iter().map(|s| s.load).sum::<f64>() / n;
        let max = self.rss.iter().map(|s| s.load).fold(0.0, f64::max);
        format!("mean {mean:.2}, max {max:.2} (2 cores)")
    }
}

pub struct Monitor {
    child: Child,
    /// Set by the soak as it goes (python runs done), read by the sampler.
    pub progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    sampler: JoinHandle<Vec<RssSample>>,
    stderr: JoinHandle<(Vec<StatsLine>, Option<u64>, Option<String>)>,
    /// The tracer's JSON report, once it has exited.
    pub report: PathBuf,
}

impl Monitor {
    /// Starts `bin` with `--verbose`, a JSON report in target/soak/NAME.json
    /// and its stderr in target/soak/NAME.stderr; returns once it traces.
    pub fn start(
        bin: &Path,
        name: &str,
        scope_args: &[&str],
        extra: &[String],
        every: u64,
    ) -> Result<Monitor> {
        let dir = target_dir().join("soak");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let report = dir.join(format!("{name}.json"));
        let log = dir.join(format!("{name}.stderr"));
        let mut child = Command::new(bin)
            .args(scope_args)
            .args(["--verbose", "--format", "json", "-o"])
            .arg(&report)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pipe = child.stderr.take().context("tracer stderr")?;
        let started = Instant::now();
        let (ready_tx, ready_rx) = mpsc::channel();
        let log_file =
            fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let progress = Arc::new(AtomicU64::new(0));
        let stderr = {
            let (progress, pid) = (progress.clone(), child.id());
            thread::spawn(move || read_stderr(pipe, log_file, started, ready_tx, &progress, pid))
        };
        if ready_rx.recv().is_err() {
            let _ = child.wait();
            bail!(
                "the tracer exited before it started tracing: see {}",
                log.display()
            );
        }
        println!(
            "soak {name}: tracing; the tracer's stderr is in {}",
            log.display()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (progress, stop) = (progress.clone(), stop.clone());
            let pid = child.id();
            let every = Duration::from_secs(every.max(1));
            thread::spawn(move || sample_rss(pid, started, &progress, &stop, every))
        };
        Ok(Monitor {
            child,
            progress,
            stop,
            sampler,
            stderr,
            report,
        })
    }

    /// Stops sampling, ends the trace (SIGINT) and waits for its report.
    pub fn stop(mut self) -> Result<Series> {
        self.stop.store(true, Ordering::Relaxed);
        let rss = self
            .sampler
            .join()
            .map_err(|_| anyhow::anyhow!("the RSS sampler panicked"))?;
        // SAFETY: kill with a pid we started and have not waited for yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let status = self.child.wait().context("waiting for the tracer")?;
        let (stats, peak_kib, tables_summary) = self
            .stderr
            .join()
            .map_err(|_| anyhow::anyhow!("the tracer's stderr reader panicked"))?;
        if !status.success() {
            bail!("the tracer failed ({status})");
        }
        Ok(Series {
            rss,
            stats,
            peak_kib,
            tables_summary,
        })
    }
}

/// Copies the tracer's stderr to `log`, says when it traces (`ready`),
/// echoes its stats lines and warnings, and returns the stats lines and
/// its peak RSS.
fn read_stderr(
    pipe: impl std::io::Read,
    mut log: fs::File,
    started: Instant,
    ready: mpsc::Sender<()>,
    progress: &AtomicU64,
    pid: u32,
) -> (Vec<StatsLine>, Option<u64>, Option<String>) {
    let mut stats = Vec::new();
    let mut peak = None;
    let mut tables = None;
    for line in BufReader::new(pipe).lines().map_while(Result::ok) {
        let _ = writeln!(log, "{line}");
        if line.starts_with("memtrace-bpf: tracing ") {
            let _ = ready.send(());
        }
        if let Some(mut s) = parse_stats(&line, started) {
            eprintln!("{line}");
            s.progress = progress.load(Ordering::Relaxed);
            if let Some(t) = &mut s.tables {
                t.trie_bytes = trie_memlock(pid);
            }
            stats.push(s);
        } else if line.contains("warning") || line.contains("error") {
            eprintln!("{line}");
        }
        if let Some(kib) = line.split("; peak RSS ").nth(1) {
            peak = kib.trim_end_matches(" KiB").parse().ok();
        }
        if let Some(summary) = line.split("unwind tables: ").nth(1) {
            tables = Some(summary.to_string());
        }
    }
    (stats, peak, tables)
}

/// `memtrace-bpf: [stats] 10 s: LIVE map N entries, M processes tracked,
/// ..., E events/s`; `secs` is measured here, from the tracer's start.
fn parse_stats(line: &str, started: Instant) -> Option<StatsLine> {
    let rest = line.strip_prefix("memtrace-bpf: [stats] ")?;
    let number_before = |unit: &str| -> Option<f64> {
        let end = rest.find(unit)?;
        rest[..end].rsplit(' ').next()?.parse().ok()
    };
    Some(StatsLine {
        secs: started.elapsed().as_secs_f64(),
        live: number_before(" entries")? as u64,
        tracked: number_before(" processes tracked")? as u64,
        events_per_sec: number_before(" events/s")?,
        tables: parse_tables(rest),
        progress: 0,
    })
}

/// `unwind tables F files R rows, M mappings of P processes, K kept
/// unused KR rows`.
fn parse_tables(line: &str) -> Option<Tables> {
    let rest = &line[line.find("unwind tables ")? + "unwind tables ".len()..];
    let words: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| -> Option<u64> { words.get(i)?.trim_end_matches(',').parse().ok() };
    Some(Tables {
        files: n(0)?,
        rows: n(2)?,
        mappings: n(4)?,
        processes: n(7)?,
        kept_files: n(9).unwrap_or(0),
        kept_rows: n(12).unwrap_or(0),
        trie_bytes: None,
    })
}

/// `memlock` of the tracer's LPM trie map (UNWIND_MAPPINGS; map_type 11
/// in /proc/PID/fdinfo): what the kernel charges for its entries.
fn trie_memlock(pid: u32) -> Option<u64> {
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo")).ok()?.flatten() {
        let Ok(info) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        if field("map_type:") == Some("11") {
            return field("memlock:")?.parse().ok();
        }
    }
    None
}

fn sample_rss(
    pid: u32,
    started: Instant,
    progress: &AtomicU64,
    stop: &AtomicBool,
    every: Duration,
) -> Vec<RssSample> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(rss_kib) = vm_rss_kib(pid) {
            out.push(RssSample {
                secs: started.elapsed().as_secs_f64(),
                progress: progress.load(Ordering::Relaxed),
                rss_kib,
                load: load_average().unwrap_or(0.0),
            });
        }
        // Short naps, so that a stop is seen quickly.
        let due = Instant::now() + every;
        while Instant::now() < due && !stop.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(100));
        }
    }
    out
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

fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
