//! `cargo xtask bench-redis`: what tracing costs a real server. Debian's
//! redis-server is loaded by redis-benchmark (SET and GET, 100-byte values,
//! random keys), untraced, under memtrace-bpf's probes doing nothing (the
//! floor), traced by `--pid`, by `--binary /usr/bin/redis-server`, by
//! `--cgroup` (redis-server alone in a scratch cgroup v2) and system-wide,
//! all at the default sampling rate. Besides requests per second, each
//! mode's cost is the server's CPU time per request (SET and GET together).
//! `--rounds` interleaved rounds of all modes, one redis-server for all of
//! them, medians compared. Each traced mode's row
//! names the allocator the tracer hooked: redis allocates through
//! libjemalloc.so.2, and a mode that hooks another one costs redis nothing
//! and records nothing of it (a warning says so).
//!
//! The server and the client are pinned to one CPU each when two are
//! available: on a 2-core machine they would otherwise compete for the same
//! core and the numbers would mostly measure the scheduler. The tracer is
//! not pinned: it shares the cores with both (its CPU time is reported).
//!
//! Whatever else runs on the machine shows in the numbers at once (two
//! cores, both busy). A run is repeated, after a pause, when other processes
//! used more than FOREIGN_MAX of a core during it or another memtrace-bpf was
//! running (system-wide tracing hooks the client's and server's allocators
//! too); one that stays disturbed is kept and counted in the table.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

mod cgroup;
mod server;

use server::{Redis, CLIENTS, KEYSPACE, REDIS_SERVER, VALUE_BYTES};

use crate::{
    bench_proc::{json_u64, median_by, peak_rss_kib, Proc},
    cmd::{other_tracer, target_dir, wait_timeout},
    cpu::{children_cpu_secs, cpu_secs, machine_busy_secs, Pins},
};

/// Requests per command in a mode's first run; later runs are sized from
/// the mode's throughput so far to last about TEST_SECS per command (a
/// traced server may be ten times slower), within MIN_/MAX_REQUESTS.
const REQUESTS: u32 = 20_000;
const TEST_SECS: f64 = 1.0;
const MIN_REQUESTS: u32 = 5_000;
const MAX_REQUESTS: u32 = 200_000;
/// CPU time of processes other than server, client and tracer, in cores,
/// above which a run counts as disturbed.
const FOREIGN_MAX: f64 = 0.15;
/// The pause between attempts of a disturbed run (--attempts).
const BACKOFF: Duration = Duration::from_secs(10);
/// For the tracer to write its report and detach.
const TRACER_EXIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq)]
enum Scope {
    Untraced,
    /// `--pid` with the server's pid.
    Pid,
    /// `--binary REDIS_SERVER`.
    Binary,
    /// `--cgroup` with the scratch cgroup redis-server runs in alone.
    Cgroup,
    /// No target: every process on the machine.
    System,
}

struct Mode {
    name: &'static str,
    what: &'static str,
    scope: Scope,
    args: &'static [&'static str],
}

const MODES: &[Mode] = &[
    Mode {
        name: "untraced",
        what: "untraced",
        scope: Scope::Untraced,
        args: &[],
    },
    Mode {
        name: "noop",
        what: "`--pid PID --noop-probes` (probes that do nothing: the floor)",
        scope: Scope::Pid,
        args: &["--noop-probes"],
    },
    Mode {
        name: "pid",
        what: "`--pid PID` (defaults)",
        scope: Scope::Pid,
        args: &[],
    },
    Mode {
        name: "binary",
        what: "`--binary /usr/bin/redis-server` (defaults)",
        scope: Scope::Binary,
        args: &[],
    },
    Mode {
        name: "cgroup",
        what: "`--cgroup CGROUP` (redis-server alone in it; defaults)",
        scope: Scope::Cgroup,
        args: &[],
    },
    Mode {
        name: "system",
        what: "system-wide (defaults)",
        scope: Scope::System,
        args: &[],
    },
];

#[derive(Default, Clone)]
struct RunResult {
    /// redis-benchmark's -n.
    requests: u32,
    set_rps: f64,
    get_rps: f64,
    /// The server's CPU time per request, SET and GET together, in µs.
    server_us_per_req: f64,
    /// The tracer's CPU time per second of the benchmark (1.0 = a core).
    tracer_cpu: Option<f64>,
    peak_rss_kib: Option<u64>,
    recorded: u64,
    lost: u64,
    allocator: Option<String>,
    /// Other processes' CPU use during the run, in cores.
    foreign_cores: f64,
    /// Another memtrace-bpf ran before or after the run.
    other_tracer: bool,
}

impl RunResult {
    fn disturbed(&self) -> bool {
        self.foreign_cores > FOREIGN_MAX || self.other_tracer
    }
}

pub fn run(rounds: usize, attempts: usize) -> Result<()> {
    crate::setup::run()?;
    crate::build_release()?;
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir)?;
    let tracer = target_dir().join("release/memtrace-bpf");
    let pins = Pins::choose();
    println!("{}", pins.describe());

    // Made before redis-server, so that it is removed after the server is
    // gone (drop order).
    let cgroup = cgroup::Cgroup::new()?;
    let redis = Redis::start(&dir.join("redis-data"), pins.server.as_deref())?;
    cgroup.add(redis.child.id())?;
    // Fills redis' allocator caches and the client's connections once.
    redis.benchmark(pins.client.as_deref(), REQUESTS)?;
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); MODES.len()];
    let mut requests = vec![REQUESTS; MODES.len()];
    for round in 0..rounds {
        for (i, mode) in MODES.iter().enumerate() {
            let mut attempt = 1;
            let r = loop {
                let r = run_once(
                    &redis,
                    &tracer,
                    mode,
                    &cgroup.path,
                    &dir,
                    pins.client.as_deref(),
                    requests[i],
                )
                .with_context(|| format!("round {} of {}", round + 1, mode.name))?;
                eprintln!(
                    "bench-redis: {} round {} attempt {attempt}: -n {}: SET {:.0}/s, GET {:.0}/s, \
                     server {:.2} µs/request; other processes {:.2} cores{}",
                    mode.name,
                    round + 1,
                    r.requests,
                    r.set_rps,
                    r.get_rps,
                    r.server_us_per_req,
                    r.foreign_cores,
                    if r.other_tracer {
                        ", another memtrace-bpf running"
                    } else {
                        ""
                    }
                );
                if !r.disturbed() || attempt >= attempts {
                    break r;
                }
                attempt += 1;
                thread::sleep(BACKOFF);
            };
            results[i].push(r);
            let rps = median(&results[i], |r| r.set_rps.min(r.get_rps));
            requests[i] = ((rps * TEST_SECS) as u32).clamp(MIN_REQUESTS, MAX_REQUESTS);
        }
    }
    report(&results, rounds, &pins, &dir)
}

/// One benchmark run on an emptied server, under `mode`'s tracer if any.
fn run_once(
    redis: &Redis,
    tracer: &Path,
    mode: &Mode,
    cgroup: &str,
    dir: &Path,
    client_cpu: Option<&str>,
    requests: u32,
) -> Result<RunResult> {
    redis.cli(&["FLUSHALL"])?;
    let report_path: PathBuf = dir.join(format!("redis-{}.json", mode.name));
    let mut tracer_proc = start_tracer(redis, tracer, mode, cgroup, &report_path)?;
    let tracer_pid = tracer_proc.as_ref().map(|t| t.child.id());
    let tracer_cpu = || tracer_pid.and_then(cpu_secs);
    let server_cpu = || cpu_secs(redis.child.id()).unwrap_or(0.0);
    let other_before = other_tracer(tracer_pid);
    let (busy_before, server_before, client_before) =
        (machine_busy_secs(), server_cpu(), children_cpu_secs());
    let cpu_before = tracer_cpu();
    let started = Instant::now();
    let (set_rps, get_rps) = redis.benchmark(client_cpu, requests)?;
    let secs = started.elapsed().as_secs_f64();
    let cpu_after = tracer_cpu();
    let server_secs = server_cpu() - server_before;
    // redis-benchmark has been reaped: its CPU time is in RUSAGE_CHILDREN.
    let ours = server_secs
        + (children_cpu_secs() - client_before)
        + cpu_before.zip(cpu_after).map_or(0.0, |(a, b)| b - a);
    let mut result = RunResult {
        requests,
        set_rps,
        get_rps,
        // Each run sends `requests` SETs, then as many GETs.
        server_us_per_req: server_secs * 1e6 / (2.0 * f64::from(requests)),
        tracer_cpu: cpu_before.zip(cpu_after).map(|(a, b)| (b - a) / secs),
        foreign_cores: ((machine_busy_secs() - busy_before - ours) / secs).max(0.0),
        other_tracer: other_before || other_tracer(tracer_pid),
        ..Default::default()
    };
    if let Some(t) = tracer_proc.as_mut() {
        stop_tracer(t, &report_path, &mut result)?;
    }
    Ok(result)
}

/// `mode`'s tracer started on `redis` (None when untraced), writing its
/// JSON report to `report_path`, once it says it is tracing.
fn start_tracer(
    redis: &Redis,
    tracer: &Path,
    mode: &Mode,
    cgroup: &str,
    report_path: &Path,
) -> Result<Option<Proc>> {
    let target = match mode.scope {
        Scope::Untraced => None,
        Scope::Pid => Some(vec!["--pid".to_string(), redis.child.id().to_string()]),
        Scope::Binary => Some(vec!["--binary".to_string(), REDIS_SERVER.to_string()]),
        Scope::Cgroup => Some(vec!["--cgroup".to_string(), cgroup.to_string()]),
        Scope::System => Some(Vec::new()),
    };
    Ok(match target {
        None => None,
        Some(target) => {
            let mut cmd = Command::new(tracer);
            cmd.args(target)
                .args(["-v", "--format", "json", "-o"])
                .arg(report_path)
                .args(mode.args);
            let mut t = Proc::spawn(cmd, false)?;
            t.wait_line("memtrace-bpf: tracing ")?;
            Some(t)
        }
    })
}

/// Stops the tracer with SIGINT and reads into `result` its peak RSS, and
/// from its report what it recorded, lost and hooked.
fn stop_tracer(t: &mut Proc, report_path: &Path, result: &mut RunResult) -> Result<()> {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(t.child.id() as libc::pid_t, libc::SIGINT) };
    let status = wait_timeout(&mut t.child, TRACER_EXIT).context("tracer did not exit")?;
    let stderr = t.rest();
    if !status.success() {
        bail!("tracer failed ({status}): {}", stderr.join("\n"));
    }
    result.peak_rss_kib = peak_rss_kib(&stderr);
    let text = fs::read_to_string(report_path)?;
    result.recorded = json_u64(&text, "\"alloc_objects\"").unwrap_or(0);
    result.lost = [
        "\"ringbuf_full\"",
        "\"live_map_full\"",
        "\"stack_lost\"",
        "\"inflight_full\"",
        "\"read_failed\"",
    ]
    .iter()
    .filter_map(|k| json_u64(&text, k))
    .sum();
    // The note "allocator hooked: jemalloc (/usr/lib/.../libjemalloc.so.2)".
    result.allocator = text.find("allocator hooked: ").and_then(|i| {
        let rest = &text[i + "allocator hooked: ".len()..];
        let note = &rest[..rest.find('"')?];
        // Shortened to "jemalloc (libjemalloc.so.2)".
        Some(match note.split_once(" (") {
            Some((kind, path)) => {
                let file = path.trim_end_matches(')');
                format!("{kind} ({})", file.rsplit('/').next().unwrap_or(file))
            }
            None => note.to_string(),
        })
    });
    Ok(())
}

/// The median of one number over the runs.
fn median(runs: &[RunResult], f: impl Fn(&RunResult) -> f64) -> f64 {
    median_by(runs, &f).map_or(f64::NAN, f)
}

fn report(results: &[Vec<RunResult>], rounds: usize, pins: &Pins, dir: &Path) -> Result<()> {
    let version =
        crate::cmd::output(Command::new(REDIS_SERVER).arg("--version")).unwrap_or_default();
    let base_set = median(&results[0], |r| r.set_rps);
    let base_get = median(&results[0], |r| r.get_rps);
    let pid_cost = MODES
        .iter()
        .position(|m| m.name == "pid")
        .map_or(f64::NAN, |i| median(&results[i], |r| r.server_us_per_req));
    println!(
        "\n{} redis-benchmark -q --csv -n N -c {CLIENTS} -d {VALUE_BYTES} -r {KEYSPACE} -t set,get, N sized for about {TEST_SECS} s per command; \
         medians of {rounds} interleaved rounds; {}\n",
        version.trim(),
        pins.describe()
    );
    println!("| mode | hooked | SET req/s | GET req/s | SET x untraced | GET x untraced | server CPU µs/request | x --pid | tracer CPU (% of a core) | tracer peak RSS | recorded (estimate) | lost | disturbed runs |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut json = Vec::new();
    let mut warnings = Vec::new();
    for (mode, runs) in MODES.iter().zip(results) {
        json.push(report_mode(
            mode,
            runs,
            (base_set, base_get, pid_cost),
            &mut warnings,
        ));
    }
    println!();
    for w in &warnings {
        println!("{w}");
    }
    let path = dir.join("redis.json");
    fs::write(
        &path,
        format!(
            "{{\"benchmark\":\"redis-benchmark SET/GET\",\"redis\":\"{}\",\"test_secs\":{TEST_SECS},\"clients\":{CLIENTS},\"value_bytes\":{VALUE_BYTES},\"keyspace\":{KEYSPACE},\"rounds\":{rounds},\"pinning\":\"{}\",\"modes\":[\n{}\n]}}\n",
            escape(version.trim()),
            escape(&pins.describe()),
            json.join(",\n")
        ),
    )?;
    println!("written to {}", path.display());
    Ok(())
}

/// Prints `mode`'s row of the table, adds a warning when it recorded
/// nothing of redis, and returns its JSON object. `base`: the untraced
/// SET and GET rates and --pid's server cost, that the row is compared with.
fn report_mode(
    mode: &Mode,
    runs: &[RunResult],
    (base_set, base_get, pid_cost): (f64, f64, f64),
    warnings: &mut Vec<String>,
) -> String {
    let set = median(runs, |r| r.set_rps);
    let get = median(runs, |r| r.get_rps);
    let cost = median(runs, |r| r.server_us_per_req);
    let traced = mode.scope != Scope::Untraced;
    let cpu = median(runs, |r| r.tracer_cpu.unwrap_or(0.0));
    let rss = median(runs, |r| r.peak_rss_kib.unwrap_or(0) as f64);
    let recorded = median(runs, |r| r.recorded as f64);
    let lost: u64 = runs.iter().map(|r| r.lost).sum();
    let disturbed = runs.iter().filter(|r| r.disturbed()).count();
    let hooked = runs
        .iter()
        .find_map(|r| r.allocator.clone())
        .unwrap_or_else(|| "-".into());
    if traced && !mode.args.contains(&"--noop-probes") && recorded == 0.0 {
        warnings.push(format!(
            "warning: {} recorded no allocation of redis-server: it hooked {hooked}, which \
             redis does not allocate through, so its numbers do not show what tracing redis costs",
            mode.what
        ));
    }
    let (cpu_s, rss_s, recorded_s, lost_s) = if traced {
        (
            format!("{:.1}%", 100.0 * cpu),
            format!("{:.0} MiB", rss / 1024.0),
            format!("{recorded:.0}"),
            lost.to_string(),
        )
    } else {
        ("-".into(), "-".into(), "-".into(), "-".into())
    };
    println!(
        "| {} | {hooked} | {set:.0} | {get:.0} | {:.2} | {:.2} | {cost:.2} | {:.2} | {cpu_s} | {rss_s} | {recorded_s} | {lost_s} | {disturbed} of {} |",
        mode.what,
        set / base_set,
        get / base_get,
        cost / pid_cost,
        runs.len()
    );
    let list = |f: fn(&RunResult) -> f64| {
        runs.iter()
            .map(|r| format!("{:.0}", f(r)))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "{{\"mode\":\"{}\",\"hooked\":\"{}\",\"set_rps\":{set:.0},\"get_rps\":{get:.0},\"server_us_per_req\":{cost:.3},\"server_us_per_req_runs\":[{}],\"set_rps_runs\":[{}],\"get_rps_runs\":[{}],\"requests_runs\":[{}],\"tracer_cpu\":{cpu:.4},\"peak_rss_kib\":{rss:.0},\"recorded\":{recorded:.0},\"lost\":{lost},\"disturbed_runs\":{disturbed}}}",
        mode.name,
        escape(&hooked),
        runs.iter()
            .map(|r| format!("{:.3}", r.server_us_per_req))
            .collect::<Vec<_>>()
            .join(","),
        list(|r| r.set_rps),
        list(|r| r.get_rps),
        list(|r| f64::from(r.requests)),
    )
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
