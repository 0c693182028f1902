//! `--serve ADDR`: the profile over HTTP while the
//! trace goes on, read by its real consumers (`go tool pprof`, the
//! Prometheus client library's text parser), and the trace ends as it
//! would without it.

use std::{
    io::Write as _,
    net::TcpStream,
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

use crate::harness::{
    compile_c,
    http::{get, get_text, parse_prometheus, phases_served, served_addr, site_values},
    pprof::pprof,
    scratch,
    sites::{assert_no_losses, per_site, O2_FLAGS},
    JsonTracer, Lines, Target, TRACER,
};

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

#[test]
fn metrics_parse_as_prometheus_text_and_match_the_live_heap() {
    let (mut target, tracer, addr) = phases_served("serve-metrics");
    target.send("a");
    target.wait_for("did a");
    let (status, text) = get_text(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    // Every sample, as name{labels} value, by the Prometheus client
    // library's own parser.
    let parsed = parse_prometheus(&text);
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
    // Every view the route takes is named, the peak ones too.
    assert!(
        body.contains("peak-space") && body.contains("peak-objects"),
        "{body}"
    );
    let (status, svg) = get_text(&addr, "/flamegraph.svg?view=peak-objects");
    assert_eq!(status, 200, "{svg}");
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

/// `?seconds=N` on /debug/pprof/heap, fetched by `go tool pprof`: the
/// profile of the window. leak_steps.c keeps 25 blocks of 1000 bytes from
/// leaky() per step and allocates and frees 10 of 3000 from churn(); two
/// steps come before the window, one in it.
#[test]
fn go_tool_pprof_reads_a_heap_delta_of_the_next_seconds() {
    let bin = compile_c("leak_steps", "serve-window", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("serve-window", &["--pid", &pid, "--serve", ":0"]);
    let addr = served_addr(&mut tracer);
    for _ in 0..2 {
        target.send("l");
        target.wait_for("did l");
    }
    for bad in ["0", "301", "-1", "x", "1.5"] {
        let (status, body) = get_text(&addr, &format!("/debug/pprof/heap?seconds={bad}"));
        assert_eq!(status, 400, "seconds={bad}: {body}");
        assert!(body.contains("from 1 to 300"), "{body}");
    }
    let tmp = scratch("serve-window-tmp");
    std::fs::create_dir_all(&tmp).expect("scratch dir");
    // The window opens when the server's first snapshot is built, which a
    // client cannot see: the step goes half a window after go tool pprof
    // says it is fetching, and one that fell outside the window anyway (a
    // loaded machine) is retried with a longer one. The profile's time and
    // duration say where the window was.
    for attempt in 1..=4u64 {
        let seconds = 2 * attempt;
        let file = tmp.join(format!("window-{attempt}.pb.gz"));
        let mut fetch = Command::new("go")
            .args(["tool", "pprof", "-proto"])
            .arg(format!("http://{addr}/debug/pprof/heap?seconds={seconds}"))
            .env("PPROF_TMPDIR", &tmp)
            .env("HOME", &tmp)
            .stdout(std::fs::File::create(&file).expect("create the profile file"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run go tool pprof (Debian's golang-go, cargo xtask setup)");
        let mut said = Lines::new(fetch.stderr.take().expect("stderr piped"));
        said.wait_for("Fetching profile over HTTP", "go tool pprof");
        std::thread::sleep(std::time::Duration::from_secs(seconds / 2));
        // The held request does not hold the others.
        let (status, text) = get_text(&addr, "/metrics");
        assert_eq!(status, 200, "{text}");
        let sent = unix_ns();
        target.send("l");
        target.wait_for("did l");
        let done = unix_ns();
        let status = fetch.wait().expect("wait for go tool pprof");
        assert!(status.success(), "go tool pprof failed: {}", said.rest());
        let raw = pprof(&["-raw"], &file);
        let (start, length) = time_and_duration(&file);
        assert_eq!(length, seconds * 1_000_000_000, "{raw}");
        if !(start <= sent && done <= start + length) {
            println!(
                "attempt {attempt}: the step ({sent} to {done}) was outside the window \
                 ({start} + {length})"
            );
            continue;
        }
        // [alloc objects, alloc bytes, in-use objects, in-use bytes]: the
        // window's step alone, not the 50 blocks kept from before it.
        assert_eq!(
            site_values(&raw, "leaky"),
            [25, 25_000, 25, 25_000],
            "{raw}"
        );
        assert_eq!(site_values(&raw, "churn"), [10, 30_000, 0, 0], "{raw}");
        let comments = pprof(&["-comments"], &file);
        assert!(
            comments.contains("in-use counts are the blocks allocated then"),
            "{comments}"
        );
        let (report, _) = tracer.stop();
        let leaky = per_site(&report)["leaky"];
        assert_eq!(leaky[0], (2 + attempt) * 25_000, "the trace's own in-use");
        return;
    }
    panic!("no step fell inside a window in 4 attempts");
}

fn unix_ns() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_nanos()).expect("fits")
}

/// pprof's time_nanos and duration_nanos of a gzip-compressed profile.
fn time_and_duration(file: &std::path::Path) -> (u64, u64) {
    use prost::Message as _;
    use std::io::Read as _;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(file).expect("open the profile"))
        .read_to_end(&mut raw)
        .expect("gunzip the profile");
    let pb = memtrace_bpf::report::proto::Profile::decode(&raw[..]).expect("a pprof profile");
    let u = |v: i64| u64::try_from(v).expect("positive");
    (u(pb.time_nanos), u(pb.duration_nanos))
}
