//! A real third-party server: Debian's redis-server (which links Debian's
//! libjemalloc.so.2 and allocates through it), loaded by redis-benchmark for
//! about three seconds and traced by `--binary /usr/bin/redis-server` at the
//! default sampling rate. Needs the redis-server and redis-tools packages
//! (`cargo xtask setup` installs them).

use std::{
    fs::{self, File},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    process::run_timeout, read_json, scratch, sites::assert_no_losses, JsonTracer,
};

/// A symlink to redis-check-rdb in Debian's package; the tracer names the
/// program (and its frames' module) as given.
const REDIS_SERVER: &str = "/usr/bin/redis-server";
const REDIS_CLI: &str = "/usr/bin/redis-cli";
const REDIS_BENCHMARK: &str = "/usr/bin/redis-benchmark";
/// How long redis-benchmark loads the server while it is traced.
const LOAD: Duration = Duration::from_secs(3);
/// Limit for any one redis-cli or redis-benchmark run, and for redis-server
/// to answer PING after its start.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(15);
/// Set before the trace, read after it.
const SENTINEL_KEY: &str = "memtrace:sentinel";
const SENTINEL_VALUE: &str = "still-here";
/// How many of the heaviest stacks (by allocated and by in-use bytes) must be
/// symbolized redis frames.
const TOP: usize = 5;
/// Redis allocates through its own wrappers in zmalloc.c; these are exported
/// in the stripped executable's dynamic symbol table.
const ZMALLOC: &[&str] = &[
    "zmalloc",
    "zmalloc_usable",
    "ztrymalloc",
    "ztrymalloc_usable",
    "zcalloc",
    "zcalloc_usable",
    "ztrycalloc",
    "ztrycalloc_usable",
    "zrealloc",
    "zrealloc_usable",
    "ztryrealloc",
    "ztryrealloc_usable",
    "zstrdup",
];
/// The callers that make the objects a SET/GET/LPUSH/INCR workload keeps or
/// churns: strings, objects, dictionary entries, clients and their buffers.
const REDIS_CALLERS: &[&str] = &[
    "sdsnewlen",
    "_sdsnewlen",
    "_sdsMakeRoomFor",
    "sdsMakeRoomFor",
    "createObject",
    "createStringObject",
    "createRawStringObject",
    "createEmbeddedStringObject",
    "dictAddRaw",
    "_dictExpand",
    "dbAdd",
    "createClient",
    "processMultibulkBuffer",
    "listAddNodeHead",
    "quicklistCreate",
    "lpNew",
    "lpInsert",
];

/// A redis-server on a free local port with no persistence, in its own
/// scratch directory; killed (and the directory removed) on drop, panics
/// included.
struct Redis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts redis-server and waits until it answers PING. A port taken
    /// between choosing and binding it makes redis exit: another is tried.
    fn start() -> Redis {
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free local port")
                .port();
            let dir = scratch(&format!("redis-{port}"));
            fs::create_dir_all(&dir).expect("redis scratch dir");
            let log = File::create(dir.join("redis.log")).expect("redis log file");
            let child = Command::new(REDIS_SERVER)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("redis log file"))
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("start {REDIS_SERVER}: {e} (install redis-server: cargo xtask setup)")
                });
            let mut redis = Redis { child, port, dir };
            if redis.wait_ready() {
                return redis;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// True once redis answers PING; false if it exited (port taken).
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for redis-server") {
                eprintln!("redis-server exited ({status}): {}", self.log());
                return false;
            }
            let ping = run_timeout(
                Command::new(REDIS_CLI).args(["-p", &self.port.to_string(), "PING"]),
                COMMAND_TIMEOUT,
            );
            if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING within {COMMAND_TIMEOUT:?}: {}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// `redis-cli -p PORT ARGS`: its trimmed stdout; panics if it fails.
    fn cli(&self, args: &[&str]) -> String {
        let out = run_timeout(
            Command::new(REDIS_CLI)
                .args(["-p", &self.port.to_string()])
                .args(args),
            COMMAND_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "redis-cli {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Redis still runs and answers: PING, and the key set before the trace.
    fn assert_serving(&mut self, when: &str) {
        assert!(
            self.child
                .try_wait()
                .expect("wait for redis-server")
                .is_none(),
            "redis-server exited {when}: {}",
            self.log()
        );
        assert_eq!(self.cli(&["PING"]), "PONG", "PING {when}");
        assert_eq!(
            self.cli(&["GET", SENTINEL_KEY]),
            SENTINEL_VALUE,
            "GET {when}"
        );
    }

    /// One redis-benchmark run of a few thousand requests per command, with
    /// random keys so that the data set (and the heap) grows. Returns its
    /// requests per second per command.
    fn benchmark(&self) -> Vec<(String, f64)> {
        let out = run_timeout(
            Command::new(REDIS_BENCHMARK)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-q", "--csv", "-n", "2000", "-d", "100", "-r", "100000"])
                .args(["-t", "set,get,lpush,rpush,incr"]),
            COMMAND_TIMEOUT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "redis-benchmark failed ({}): {stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // "test","rps",... then one line per test: "SET","105485.23",...
        let rows: Vec<(String, f64)> = stdout
            .lines()
            .skip(1)
            .filter_map(|l| {
                let mut cols = l.split(',').map(|c| c.trim_matches('"'));
                let test = cols.next()?.to_string();
                let rps = cols.next()?.parse().ok()?;
                Some((test, rps))
            })
            .collect();
        assert_eq!(rows.len(), 5, "five tests in: {stdout}");
        assert!(rows.iter().all(|(_, rps)| *rps > 0.0), "{stdout}");
        rows
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A function name, not `[unknown]` or a raw address.
fn symbolized(function: &str) -> bool {
    !function.is_empty() && function != "[unknown]" && !function.starts_with("0x")
}

/// The stacks of `pid`, heaviest first by `key`.
fn top_stacks<'a>(report: &'a Value, pid: u32, key: &str) -> Vec<&'a Value> {
    let mut stacks: Vec<&Value> = report["stacks"]
        .as_array()
        .expect("stacks array")
        .iter()
        .filter(|s| s["pid"] == pid)
        .collect();
    stacks.sort_by_key(|s| std::cmp::Reverse(s[key].as_u64().expect("count is a number")));
    stacks.truncate(TOP);
    stacks
}

/// A stack as `function [module]` lines, for failure messages.
fn describe(stack: &Value) -> String {
    let mut out = format!(
        "inuse {} B, alloc {} B, truncated {}:\n",
        stack["inuse_bytes"], stack["alloc_bytes"], stack["truncated"]
    );
    for f in stack["frames"].as_array().expect("frames array") {
        let module = f["module"].as_str().unwrap_or("");
        let module = module.rsplit('/').next().unwrap_or(module);
        out.push_str(&format!("    {} [{module}]\n", f["function"]));
    }
    out
}

/// The heaviest stacks start in redis' executable with a named frame (its
/// zmalloc wrappers), and between them name redis' allocating callers.
fn assert_top_stacks_are_redis(report: &Value, pid: u32, exe: &Path) {
    let exe = exe.to_str().expect("utf-8 path");
    let mut names = Vec::new();
    for key in ["alloc_bytes", "inuse_bytes"] {
        let top = top_stacks(report, pid, key);
        assert!(!top.is_empty(), "no stacks for redis pid {pid}");
        for stack in top {
            let frames = stack["frames"].as_array().expect("frames array");
            let leaf = &frames.first().expect("a stack has frames")["function"];
            assert!(
                frames.first().is_some_and(|f| f["module"] == exe)
                    && leaf.as_str().is_some_and(symbolized),
                "top stack by {key}: its allocating frame is not a named function of {exe}:\n{}",
                describe(stack)
            );
            names.extend(
                frames
                    .iter()
                    .filter(|f| f["module"] == exe)
                    .filter_map(|f| f["function"].as_str()),
            );
        }
    }
    assert!(
        names.iter().any(|n| ZMALLOC.contains(n)),
        "no zmalloc wrapper among the top stacks' frames: {names:?}"
    );
    assert!(
        names.iter().any(|n| REDIS_CALLERS.contains(n)),
        "none of {REDIS_CALLERS:?} among the top stacks' frames: {names:?}"
    );
}

/// The report is of `--binary`, holds redis' process `pid` still running,
/// and counts no missing data. Returns its notes.
fn assert_redis_traced_without_losses(report: &Value, pid: u32) -> String {
    assert!(
        report["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("binary ")),
        "{}",
        report["target"]
    );
    let process = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| {
            panic!(
                "redis pid {} is not in processes: {}",
                pid, report["processes"]
            )
        });
    assert_eq!(process["exited"], false, "{process}");
    assert_no_losses(report);
    let notes = report["notes"].to_string();
    assert!(
        !notes.contains("reused an address") && !notes.contains("malformed"),
        "{notes}"
    );
    notes
}

/// libjemalloc.so.2 is hooked and every total counts something.
fn assert_jemalloc_hooked_with_totals(report: &Value, notes: &str) {
    // Redis allocates through libjemalloc.so.2, so that is what must be
    // hooked for its allocations to be seen.
    let jemalloc_hooked = report["hooks"].as_array().expect("hooks").iter().any(|h| {
        h["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("/libjemalloc.so.2"))
            && h["status"]
                .as_str()
                .is_some_and(|s| s.starts_with("attached"))
    });
    assert!(
        jemalloc_hooked,
        "redis-server allocates through libjemalloc.so.2, which is not hooked: {}; notes: {notes}",
        report["hooks"]
    );
    let totals = &report["totals"];
    for key in [
        "alloc_objects",
        "alloc_bytes",
        "inuse_objects",
        "inuse_bytes",
    ] {
        assert!(
            totals[key].as_u64().is_some_and(|v| v > 0),
            "{key} in {totals}"
        );
    }
}

#[test]
fn redis_server_under_benchmark_is_traced_by_binary_and_keeps_serving() {
    fs::canonicalize(REDIS_SERVER).unwrap_or_else(|e| {
        panic!("{REDIS_SERVER}: {e} (install redis-server: cargo xtask setup)")
    });
    let exe = Path::new(REDIS_SERVER);
    let mut redis = Redis::start();
    assert_eq!(redis.cli(&["SET", SENTINEL_KEY, SENTINEL_VALUE]), "OK");

    // The default sampling rate, as on a production server: recording every
    // allocation of a server doing ~10^5 requests/s (several allocations
    // each, a DWARF stack copy per record) would starve it and overflow the
    // ring buffer on this 2-core machine, and the test asserts no losses.
    // Sampling keeps a few hundred stacks per second, plenty for the top.
    let tracer = JsonTracer::start_sampling("redis", &["--binary", REDIS_SERVER]);
    // Whole benchmark runs (each checked) until LOAD has passed: a traced
    // server may be much slower than an untraced one.
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed() < LOAD {
        redis.benchmark();
        runs += 1;
    }
    redis.assert_serving("while traced");
    tracer.signal(libc::SIGINT);
    let (out, path) = tracer.finish_unchecked();
    eprintln!(
        "{runs} redis-benchmark runs in {:.1} s; tracer stderr:\n{}",
        started.elapsed().as_secs_f64(),
        out.stderr
    );

    // What must hold whichever allocator the tracer hooks.
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| {
            let l = l.to_lowercase();
            l.contains("error") || l.contains("panick")
        })
        .collect();
    assert!(errors.is_empty(), "error lines on stderr: {errors:#?}");
    redis.assert_serving("after the trace");
    let report = read_json(&path);
    let notes = assert_redis_traced_without_losses(&report, redis.pid());
    assert_jemalloc_hooked_with_totals(&report, &notes);
    assert_top_stacks_are_redis(&report, redis.pid(), exe);
    assert!(
        !out.stderr.contains("warning"),
        "warnings on stderr: {}",
        out.stderr
    );
}
