//! `cargo xtask bench`: the cost of tracing, measured as ratios in one run
//! (this machine is noisy; nothing here is a timed assertion).
//!
//! The target (bench/alloc_loop.c: THREADS threads of malloc/free pairs of
//! random sizes with a small live set, -O2 without frame pointers) times
//! its own loop. It runs untraced, under no-op probes at the symbols (what
//! naive tracers pay at least), beside an idle `memtrace-bpf agent`, under
//! no-op probes at the placed offsets
//! (memtrace-bpf's floor), and under memtrace-bpf in several modes; REPEATS
//! interleaved rounds, medians compared. The tracer's `--verbose` lines give
//! its CPU time, peak RSS and unwinding throughput.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::Command,
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::{
    bench_proc::{json_u64, median_by, peak_rss_kib, IdleAgent, Proc},
    cmd::{repo_root, run as run_cmd, target_dir},
    cpu::cpu_secs,
};

const REPEATS: usize = 3;
const PAIRS: u64 = 400_000;
const LONG_PAIRS: u64 = 8 * PAIRS;
const THREADS: u64 = 2;

struct Mode {
    name: &'static str,
    what: &'static str,
    tracer_args: Option<&'static [&'static str]>,
    /// --serve, with /debug/pprof/heap scraped once a second during the run.
    scrape: bool,
    /// malloc/free pairs per thread.
    pairs: u64,
    /// Untraced, beside `memtrace-bpf agent` with its standby tracer ready.
    agent: bool,
}

const MODES: &[Mode] = &[
    Mode {
        name: "untraced",
        what: "no probes",
        tracer_args: None,
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "idle-agent",
        what: "no probes, beside an idle agent (standby tracer loaded)",
        tracer_args: None,
        scrape: false,
        pairs: PAIRS,
        agent: true,
    },
    Mode {
        name: "noop-symbols",
        what: "no-op probes at the symbols (naive floor)",
        tracer_args: Some(&["--noop-probes", "--probe-placement", "entry"]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "noop-placed",
        what: "no-op probes at the placed offsets (our floor)",
        tracer_args: Some(&["--noop-probes"]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "fp-exact",
        what: "memtrace-bpf --unwind fp --sample-rate 1",
        tracer_args: Some(&["--unwind", "fp", "--sample-rate", "1"]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "tables-exact",
        what: "memtrace-bpf --sample-rate 1 (exact: tables, sessions)",
        tracer_args: Some(&["--sample-rate", "1"]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "default-no-sessions",
        what: "memtrace-bpf --uprobe-sessions off",
        tracer_args: Some(&["--uprobe-sessions", "off"]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    Mode {
        name: "default",
        what: "memtrace-bpf (defaults: tables, sampled, sessions)",
        tracer_args: Some(&[]),
        scrape: false,
        pairs: PAIRS,
        agent: false,
    },
    // Scraping is compared on runs of about 10 s: in a 1 s run the first
    // snapshot's one-time cost (reading the target's symbols) is most of
    // what a scrape costs, and a scraper's steady cost is what matters.
    Mode {
        name: "default-long",
        what: "memtrace-bpf (defaults), 8x longer run",
        tracer_args: Some(&[]),
        scrape: false,
        pairs: LONG_PAIRS,
        agent: false,
    },
    Mode {
        name: "default-scraped",
        what: "memtrace-bpf --serve, /debug/pprof/heap scraped every second, 8x longer run",
        tracer_args: Some(&["--serve", "127.0.0.1:0"]),
        scrape: true,
        pairs: LONG_PAIRS,
        agent: false,
    },
];

#[derive(Default, Clone)]
struct RunResult {
    ns_per_pair: f64,
    /// Allocations per second in the target while it ran.
    allocs_per_sec: f64,
    stacks_per_sec: Option<f64>,
    /// The tracer's CPU time per second of the target's run (1.0 = a core).
    tracer_cpu_secs: Option<f64>,
    peak_rss_kib: Option<u64>,
    recorded: u64,
    lost: u64,
    /// Scrapes answered with 200 (default-scraped only).
    scrapes: u64,
}

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::build_release()?;
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir)?;
    let bin = dir.join("alloc_loop");
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-pthread", "-o"])
            .arg(&bin)
            .arg(repo_root().join("bench/alloc_loop.c")),
    )?;
    let tracer = target_dir().join("release/memtrace-bpf");

    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); MODES.len()];
    for rep in 0..REPEATS {
        for (i, mode) in MODES.iter().enumerate() {
            let r = run_once(&bin, &tracer, mode, &dir)
                .with_context(|| format!("run {rep} of {}", mode.name))?;
            eprintln!(
                "bench: {} run {}: {:.0} ns/pair",
                mode.name,
                rep + 1,
                r.ns_per_pair
            );
            results[i].push(r);
        }
    }
    let med: Vec<RunResult> = results
        .iter()
        .map(|runs| {
            median_by(runs, |r| r.ns_per_pair)
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    report(&med, &dir)
}

/// What scraping /debug/pprof/heap costs: the target's ns per pair, and the
/// tracer's own CPU.
fn report_scraping(med: &[RunResult], ns: &dyn Fn(&str) -> f64) {
    let scraped = &med[MODES
        .iter()
        .position(|m| m.name == "default-scraped")
        .unwrap_or(0)];
    println!(
        "scraping /debug/pprof/heap every second ({} scrapes in the median run, {} lost): {:+.1}% ns per pair (target < 3%)",
        scraped.scrapes,
        scraped.lost,
        100.0 * (ns("default-scraped") / ns("default-long") - 1.0)
    );
    // The target's ns per pair moves more with this machine's noise than
    // with a scrape; what a scrape costs is the tracer's CPU, which takes
    // from the target's.
    let cpu = |name: &str| {
        MODES
            .iter()
            .position(|m| m.name == name)
            .and_then(|i| med[i].tracer_cpu_secs)
            .map_or(f64::NAN, |c| 100.0 * c)
    };
    println!(
        "scraping's own cost: tracer CPU {:.1}% -> {:.1}% of a core",
        cpu("default-long"),
        cpu("default-scraped")
    );
}

fn report(med: &[RunResult], dir: &Path) -> Result<()> {
    let ns = |name: &str| -> f64 {
        MODES
            .iter()
            .position(|m| m.name == name)
            .map_or(f64::NAN, |i| med[i].ns_per_pair)
    };
    let base = ns("untraced");
    println!(
        "\n{THREADS} threads x {PAIRS} malloc/free pairs ({LONG_PAIRS} for the longer runs), random sizes 16-4095, medians of {REPEATS} interleaved runs\n"
    );
    println!("| mode | ns per pair | x untraced | allocations/s | tracer CPU (% of a core) | tracer peak RSS | recorded (estimate) | lost |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for (mode, r) in MODES.iter().zip(med) {
        let cpu = r
            .tracer_cpu_secs
            .map_or("-".to_string(), |c| format!("{:.1}%", 100.0 * c));
        let rss = r
            .peak_rss_kib
            .map_or("-".to_string(), |k| format!("{} MiB", k / 1024));
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {cpu} | {rss} | {} | {} |",
            mode.what,
            r.ns_per_pair,
            r.ns_per_pair / base,
            r.allocs_per_sec,
            r.recorded,
            r.lost
        );
        json.push(format!(
            "{{\"mode\":\"{}\",\"ns_per_pair\":{:.1},\"tracer_cpu_secs\":{},\"peak_rss_kib\":{},\"recorded\":{},\"lost\":{}}}",
            mode.name,
            r.ns_per_pair,
            r.tracer_cpu_secs.unwrap_or(0.0),
            r.peak_rss_kib.unwrap_or(0),
            r.recorded,
            r.lost
        ));
    }
    println!();
    println!(
        "untraced beside an idle agent / untraced: {:.2} (target 1.00: nothing attached)",
        ns("idle-agent") / base
    );
    println!(
        "default / placed no-op floor: {:.2} (target <= 1.10)",
        ns("default") / ns("noop-placed")
    );
    println!(
        "exact (tables, R=1) / placed no-op floor: {:.2} (target <= 1.6)",
        ns("tables-exact") / ns("noop-placed")
    );
    println!(
        "tables vs fp, exact: {:+.0} ns per recorded allocation",
        ns("tables-exact") - ns("fp-exact")
    );
    report_scraping(med, &ns);
    let exact = &med[MODES
        .iter()
        .position(|m| m.name == "tables-exact")
        .unwrap_or(0)];
    if let Some(rate) = exact.stacks_per_sec {
        println!("user-space unwinding (exact): {rate:.0} stacks/s on one core");
    }
    let path = dir.join("bench.json");
    fs::write(&path, format!("[{}]\n", json.join(",\n")))?;
    println!("written to {}", path.display());
    Ok(())
}

fn run_once(bin: &Path, tracer: &Path, mode: &Mode, dir: &Path) -> Result<RunResult> {
    let _agent = mode
        .agent
        .then(|| IdleAgent::start(tracer, dir))
        .transpose()?;
    let mut cmd = Command::new(bin);
    cmd.arg(mode.pairs.to_string()).arg(THREADS.to_string());
    let mut target = Proc::spawn(cmd, true)?;
    target.wait_line("ready")?;
    let report_path: PathBuf = dir.join(format!("{}.json", mode.name));
    let mut served: Option<String> = None;
    let mut tracer_proc = match mode.tracer_args {
        None => None,
        Some(args) => {
            let mut cmd = Command::new(tracer);
            cmd.args([
                "--pid",
                &target.child.id().to_string(),
                "-v",
                "--format",
                "json",
                "-o",
            ])
            .arg(&report_path)
            .args(args);
            let mut t = Proc::spawn(cmd, false)?;
            t.wait_line("tracing pid")?;
            if mode.scrape {
                let line = t.wait_line("serving the profile on http://")?;
                served = line
                    .split("http://")
                    .nth(1)
                    .and_then(|rest| rest.split('/').next())
                    .map(str::to_string);
            }
            Some(t)
        }
    };
    // The tracer's CPU time while the target runs, from /proc: start-up
    // (BTF, ELF parsing) and the final symbolization are not counted.
    let tracer_cpu = || tracer_proc.as_ref().and_then(|t| cpu_secs(t.child.id()));
    let cpu_before = tracer_cpu();
    let scraper = served.map(Scraper::start);
    let started = std::time::Instant::now();
    target.send("go\n")?;
    let line = target.wait_line("ns_per_pair")?;
    let run_secs = started.elapsed().as_secs_f64();
    let scrapes = scraper.map(Scraper::stop).transpose()?.unwrap_or(0);
    let cpu_after = tracer_cpu();
    let ns_per_pair: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected target output {line:?}"))?;
    let mut result = RunResult {
        ns_per_pair,
        allocs_per_sec: (mode.pairs * THREADS) as f64 / run_secs,
        tracer_cpu_secs: cpu_before.zip(cpu_after).map(|(a, b)| (b - a) / run_secs),
        scrapes,
        ..Default::default()
    };
    if let Some(t) = tracer_proc.as_mut() {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(t.child.id() as libc::pid_t, libc::SIGINT) };
        let status = t.child.wait()?;
        if !status.success() {
            bail!("tracer failed: {}", t.rest().join("\n"));
        }
        let stderr = t.rest();
        result.stacks_per_sec = stderr
            .iter()
            .find(|l| l.contains("stacks/s"))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim_end_matches(" stacks/s").parse().ok());
        result.peak_rss_kib = peak_rss_kib(&stderr);
        let text = fs::read_to_string(&report_path)?;
        result.recorded = json_u64(&text, "\"alloc_objects\"").unwrap_or(0);
        result.lost = ["\"ringbuf_full\"", "\"live_map_full\"", "\"stack_lost\""]
            .iter()
            .filter_map(|k| json_u64(&text, k))
            .sum();
    }
    Ok(result)
}

/// Scrapes `/debug/pprof/heap` once a second, as a profile scraper would,
/// until stopped.
struct Scraper {
    stop: mpsc::Sender<()>,
    thread: thread::JoinHandle<Result<u64>>,
}

impl Scraper {
    fn start(addr: String) -> Scraper {
        let (stop, stopped) = mpsc::channel();
        let thread = thread::spawn(move || {
            let mut answered = 0;
            loop {
                scrape(&addr, "/debug/pprof/heap")?;
                answered += 1;
                match stopped.recv_timeout(Duration::from_secs(1)) {
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    _ => return Ok(answered),
                }
            }
        });
        Scraper { stop, thread }
    }

    /// How many scrapes were answered; an error if one was not.
    fn stop(self) -> Result<u64> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the scraper thread panicked"))?
    }
}

/// One GET; fails unless the answer is 200 with a body.
fn scrape(addr: &str, path: &str) -> Result<()> {
    use std::io::Read as _;
    let mut stream =
        std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let head = String::from_utf8_lossy(&response[..response.len().min(64)]).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {head}");
    }
    Ok(())
}
