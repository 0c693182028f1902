//! `--serve ADDR` (issue #13 item 2): the profile over HTTP while the
//! trace goes on, read by its real consumers (`go tool pprof`, the
//! Prometheus client library's text parser), and the trace ends as it
//! would without it.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use crate::{
    harness::{compile_c, scratch, JsonTracer, Target, Tracer, TRACER},
    sites::{assert_no_losses, per_site, O2_FLAGS},
};

/// The address the tracer says it serves on (it was given port 0).
pub(crate) fn served_addr(tracer: &mut Tracer) -> String {
    let line = tracer
        .stderr
        .wait_for("serving the profile on http://", "--serve start");
    let rest = line
        .split("http://")
        .nth(1)
        .expect("an address after http://");
    rest.split('/').next().expect("host:port").to_string()
}

/// A GET with a plain HTTP/1.1 client: (status, body).
pub(crate) fn get(addr: &str, path: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("GET {path}: no header end in {response:?}"));
    let head = String::from_utf8_lossy(&response[..end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: no status in {head}"));
    (status, response[end + 4..].to_vec())
}

pub(crate) fn get_text(addr: &str, path: &str) -> (u16, String) {
    let (status, body) = get(addr, path);
    (status, String::from_utf8(body).expect("a text body"))
}

/// The phases target (a: 10 blocks of 1000 bytes kept at site_a) traced
/// with --serve on a free port.
pub(crate) fn phases_served(tag: &str) -> (Target, JsonTracer, String) {
    let bin = compile_c("phases", tag, O2_FLAGS);
    let target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(tag, &["--pid", &pid, "--serve", "127.0.0.1:0"]);
    let addr = served_addr(&mut tracer);
    (target, tracer, addr)
}

#[test]
fn go_tool_pprof_reads_the_live_heap_while_tracing_then_the_report_is_written() {
    let (mut target, tracer, addr) = phases_served("serve-pprof");
    target.send("a");
    target.wait_for("did a");
    let tmp = scratch("serve-pprof-tmp");
    std::fs::create_dir_all(&tmp).expect("scratch dir");
    let out = Command::new("go")
        .args(["tool", "pprof", "-raw"])
        .arg(format!("http://{addr}/debug/pprof/heap"))
        .env("PPROF_TMPDIR", &tmp)
        .env("HOME", &tmp)
        .output()
        .expect("run go tool pprof (Debian's golang-go, cargo xtask setup)");
    let raw = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed: {}\n{raw}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        site_values(&raw, "site_a"),
        [10, 10_000, 10, 10_000],
        "site_a in go tool pprof -raw:\n{raw}"
    );
    target.send("b");
    target.wait_for("did b");
    let (report, _) = tracer.stop();
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    let sites = per_site(&report);
    assert_eq!(sites.get("site_a"), Some(&[0, 0, 10_000, 10]), "{report}");
    assert_eq!(
        sites.get("site_b"),
        Some(&[40_000, 20, 40_000, 20]),
        "{report}"
    );
    assert_no_losses(&report);
}

/// The sample values (alloc_objects, alloc_space, inuse_objects,
/// inuse_space) summed over the samples whose leaf location is `function`,
/// from `go tool pprof -raw`.
pub(crate) fn site_values(raw: &str, function: &str) -> [u64; 4] {
    // Locations: "     3: 0x1189 M=1 site_a /path/phases.c:22 s=0".
    let locations: Vec<&str> = raw
        .lines()
        .skip_while(|l| !l.starts_with("Locations"))
        .filter(|l| l.split_whitespace().nth(3) == Some(function))
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert!(!locations.is_empty(), "no location of {function}:\n{raw}");
    let mut sum = [0; 4];
    // Samples: "        10      10000         10      10000: 3 2 1 ".
    for line in raw
        .lines()
        .skip_while(|l| !l.starts_with("Samples"))
        .take_while(|l| !l.starts_with("Locations"))
    {
        let Some((values, stack)) = line.split_once(':') else {
            continue;
        };
        let values: Vec<u64> = values
            .split_whitespace()
            .map_while(|v| v.parse().ok())
            .collect();
        let leaf = stack.split_whitespace().next();
        if values.len() == 4 && leaf.is_some_and(|l| locations.contains(&l)) {
            for (s, v) in sum.iter_mut().zip(values) {
                *s += v;
            }
        }
    }
    sum
}

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_live_heap() {
    let (mut target, tracer, addr) = phases_served("serve-metrics");
    target.send("a");
    target.wait_for("did a");
    let (status, text) = get_text(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    // The Prometheus client library's own parser (Debian's
    // python3-prometheus-client): every sample, as name{labels} value.
    let parser = "import sys\n\
        from prometheus_client.parser import text_string_to_metric_families\n\
        for f in text_string_to_metric_families(sys.stdin.read()):\n\
        \x20   for s in f.samples:\n\
        \x20       labels = ','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))\n\
        \x20       print(f'{s.name}{{{labels}}} {s.value:.0f}')\n";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", parser])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3 (cargo xtask setup installs python3-prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed the parser");
    let out = child.wait_with_output().expect("parser output");
    let parsed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "not Prometheus text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = target.pid();
    for expected in [
        "memtrace_inuse_bytes{} 10000".to_string(),
        "memtrace_inuse_objects{} 10".to_string(),
        "memtrace_allocated_bytes_total{} 10000".to_string(),
        "memtrace_lost_total{counter=ringbuf_full,loss=true} 0".to_string(),
        "memtrace_lost_total{counter=stack_lost,loss=true} 0".to_string(),
        format!("memtrace_process_inuse_bytes{{pid={pid},program="),
    ] {
        assert!(parsed.contains(&expected), "{expected} not in:\n{parsed}");
    }
    for metric in [
        "memtrace_events_total{}",
        "process_cpu_seconds_total{}",
        "process_resident_memory_bytes{}",
    ] {
        assert!(parsed.contains(metric), "{metric} not in:\n{parsed}");
    }
    let (report, _) = tracer.stop();
    assert_eq!(
        per_site(&report).get("site_a"),
        Some(&[10_000, 10, 10_000, 10])
    );
}

#[test]
fn unknown_paths_get_404_with_the_endpoints_and_bad_queries_400() {
    let (_target, tracer, addr) = phases_served("serve-404");
    for path in ["/nope", "/../../etc/passwd", "/debug/pprof/", "/metrics/x"] {
        let (status, body) = get_text(&addr, path);
        assert_eq!(status, 404, "{path}: {body}");
        for endpoint in [
            "/debug/pprof/heap",
            "/debug/pprof/allocs",
            "/flamegraph.svg",
            "/profile.json",
            "/metrics",
        ] {
            assert!(body.contains(endpoint), "{path}: {body}");
        }
        assert!(!body.contains("root:"), "{path} reached a file: {body}");
    }
    let (status, body) = get_text(&addr, "/flamegraph.svg?view=nope");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("inuse-space, inuse-objects"), "{body}");
    for seconds in ["0", "301", "-1", "x"] {
        let (status, body) = get_text(&addr, &format!("/debug/pprof/allocs?seconds={seconds}"));
        assert_eq!(status, 400, "seconds={seconds}: {body}");
        assert!(body.contains("from 1 to 300"), "{body}");
    }
    let (status, svg) = get_text(&addr, "/flamegraph.svg?view=alloc-objects");
    assert_eq!(status, 200, "{svg}");
    assert!(svg.contains("<svg"), "{svg}");
    let (status, json) = get_text(&addr, "/profile.json");
    assert_eq!(status, 200, "{json}");
    let profile: serde_json::Value = serde_json::from_str(&json).expect("JSON profile");
    assert!(
        profile["end_reason"]
            .as_str()
            .is_some_and(|r| r.contains("the trace went on")),
        "{}",
        profile["end_reason"]
    );
    tracer.stop();
}

#[test]
fn twenty_parallel_scrapers_during_an_allocation_burst_lose_no_events() {
    const BLOCKS: u64 = 300_000;
    let bin = compile_c("buildup", "serve-burst", &["-O2"]);
    let mut target = Target::start(&bin, &[&BLOCKS.to_string()]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(
        "serve-burst",
        &["--pid", &pid, "--serve", ":0", "--unwind", "fp"],
    );
    let addr = served_addr(&mut tracer);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let scrapers: Vec<_> = (0..20)
        .map(|i| {
            let (addr, stop, answered) = (addr.clone(), stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let paths = ["/debug/pprof/heap", "/metrics", "/profile.json"];
                let path = paths[i % paths.len()];
                while !stop.load(Ordering::Relaxed) {
                    let (status, body) = get(&addr, path);
                    assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    target.run_sites();
    stop.store(true, Ordering::Relaxed);
    for s in scrapers {
        s.join().expect("a scraper failed");
    }
    assert!(answered.load(Ordering::Relaxed) >= 20);
    let (report, _) = tracer.stop();
    assert_no_losses(&report);
    let totals = &report["totals"];
    assert_eq!(totals["inuse_objects"], BLOCKS, "{totals}");
    assert_eq!(totals["inuse_bytes"], 24 * BLOCKS, "{totals}");
}

#[test]
fn a_port_in_use_is_refused_before_anything_is_attached() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().expect("its address").to_string();
    let marker = scratch("serve-port-in-use-ran");
    let _ = std::fs::remove_file(&marker);
    let out = Command::new(TRACER)
        .args(["--serve", &addr, "--", "touch"])
        .arg(&marker)
        .output()
        .expect("run memtrace-bpf");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("--serve {addr}: cannot listen"))
            && stderr.contains("pick another port"),
        "{stderr}"
    );
    assert!(!stderr.contains("memtrace-bpf: tracing"), "{stderr}");
    assert!(!marker.exists(), "the command ran although --serve failed");
}

#[test]
fn a_client_that_sends_nothing_does_not_keep_the_trace_from_ending() {
    let (mut target, tracer, addr) = phases_served("serve-silent");
    // One says nothing, one stops halfway through its request line, one
    // sends a header larger than the server reads.
    let _silent = TcpStream::connect(&addr).expect("connect");
    let mut half = TcpStream::connect(&addr).expect("connect");
    half.write_all(b"GET /metr").expect("send half a request");
    let mut huge = TcpStream::connect(&addr).expect("connect");
    let _ = huge.write_all(format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(64 << 10)).as_bytes());
    target.send("a");
    target.wait_for("did a");
    // The server still answers others meanwhile.
    let (status, text) = get_text(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("memtrace_inuse_bytes 10000"), "{text}");
    // The open connections do not hold the trace: it ends with its report
    // (the harness fails the test if the tracer does not exit in time).
    let (report, out) = tracer.stop();
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    assert_eq!(
        per_site(&report).get("site_a"),
        Some(&[10_000, 10, 10_000, 10])
    );
    assert!(out.stderr.contains("report written to"), "{}", out.stderr);
}
