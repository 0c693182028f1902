//! `--serve` against hostile programs and clients:
//! what a traced program names itself is escaped in /metrics, held
//! connections cannot lock scrapers out, in-flight requests are answered
//! when the trace ends, and every endpoint takes `?min_age=` by one rule.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use crate::harness::{
    compile_c,
    hostile::{assert_no_raw_controls, hostile_program},
    http::{get, get_text, parse_prometheus, phases_served, served_addr},
    sites::O2_FLAGS,
    JsonTracer, Target,
};

#[test]
fn metrics_escape_a_program_path_that_holds_terminal_escapes() {
    // hostile.c under a name with a colour escape, a bell and a C1 CSI.
    let built = hostile_program("metrics-label");
    let program = built.with_file_name("bell\x07\x1b[31mred\u{9b}2J");
    std::fs::copy(&built, &program).expect("copy the hostile program");
    let mut target = Target::start(&program, &["wait"]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("metrics-label", &["--pid", &pid, "--serve", "127.0.0.1:0"]);
    let addr = served_addr(&mut tracer);
    target.run_sites();
    let (status, text) = get_text(&addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert_no_raw_controls("/metrics", &text);
    let parsed = parse_prometheus(&text);
    let dir = program.parent().expect("a directory").display();
    let shown = format!("program={dir}/bell\\x07\\x1b[31mred\\u{{9b}}2J}}");
    assert!(
        parsed.contains(&format!("memtrace_process_inuse_bytes{{pid={pid},"))
            && parsed.contains(&shown),
        "{shown} not in:\n{parsed}"
    );
    tracer.stop();
}

#[test]
fn every_endpoint_honours_min_age_or_refuses_a_bad_one() {
    let bin = compile_c("phases", "serve-min-age", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("serve-min-age", &["--pid", &pid, "--serve", ":0"]);
    let addr = served_addr(&mut tracer);
    target.send("a");
    target.wait_for("did a");
    let endpoints = [
        "/",
        "/debug/pprof/heap",
        "/debug/pprof/allocs",
        "/debug/pprof/allocs?seconds=1",
        "/debug/pprof/heap?seconds=1",
        "/flamegraph.svg",
        "/profile.json",
        "/metrics",
    ];
    let with = |path: &str, query: &str| match path.contains('?') {
        true => format!("{path}&{query}"),
        false => format!("{path}?{query}"),
    };
    for path in endpoints {
        for bad in ["nope", "-1", "inf", "NaN", "1e30"] {
            let (status, body) = get_text(&addr, &with(path, &format!("min_age={bad}")));
            assert_eq!(status, 400, "{path} min_age={bad}: {body}");
            assert!(
                body.contains("?min_age= takes the seconds"),
                "{path}: {body}"
            );
        }
        // Every block (10 of 1000 bytes at site_a) is younger than an hour.
        let (status, _) = get(&addr, &with(path, "min_age=3600"));
        assert_eq!(status, 200, "{path}?min_age=3600");
    }
    let (_, metrics) = get_text(&addr, "/metrics?min_age=3600");
    assert!(metrics.contains("memtrace_inuse_bytes 0\n"), "{metrics}");
    let (_, metrics) = get_text(&addr, "/metrics?min_age=0");
    assert!(
        metrics.contains("memtrace_inuse_bytes 10000\n"),
        "{metrics}"
    );
    let (_, json) = get_text(&addr, "/profile.json?min_age=3600");
    let profile: serde_json::Value = serde_json::from_str(&json).expect("JSON profile");
    assert_eq!(profile["totals"]["inuse_bytes"], 0, "{json}");
    assert_eq!(profile["min_age_secs"].as_f64(), Some(3600.0), "{json}");
    let (_, page) = get_text(&addr, "/?min_age=3600");
    assert!(
        page.contains("in use (blocks live 3600 s or more): 0 B"),
        "{page}"
    );
    tracer.stop();
}

/// Sends `GET path` on a new connection and leaves it open, unread.
fn hold(addr: &str, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("send request");
    stream
}

/// The status line and body of the response on `stream` (which said
/// nothing of closing: read up to the content length).
fn response(stream: &mut TcpStream) -> (u16, String) {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("read timeout");
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|n| n.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                let status = head.split(' ').nth(1).and_then(|s| s.parse().ok());
                return (status.unwrap_or(0), body.to_string());
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => panic!("connection closed without a whole response: {text:?}"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no response ({e}): {text:?}"),
        }
    }
}

#[test]
fn held_delta_requests_and_idle_sockets_do_not_lock_scrapers_out() {
    let (mut target, tracer, addr) = phases_served("serve-held");
    target.send("a");
    target.wait_for("did a");
    // As many 300 s delta profiles as the server has connections, then as
    // many sockets that say nothing.
    let mut deltas: Vec<TcpStream> = (0..64)
        .map(|_| hold(&addr, "/debug/pprof/allocs?seconds=300"))
        .collect();
    let _idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    for path in ["/metrics", "/debug/pprof/heap", "/metrics"] {
        let (status, body) = get(&addr, path);
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
    }
    // The last delta was over the limit: it was told so.
    let (status, body) = response(deltas.last_mut().expect("deltas"));
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("delta profiles (?seconds=) are in progress"),
        "{body}"
    );
    tracer.stop();
}

#[test]
fn delta_requests_in_flight_are_answered_when_the_trace_ends() {
    let (mut target, tracer, addr) = phases_served("serve-ending");
    target.send("a");
    target.wait_for("did a");
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| hold(&addr, "/debug/pprof/allocs?seconds=300"))
        .collect();
    // Answered after the held ones were accepted (one at a time, in order).
    let (status, _) = get(&addr, "/debug/pprof/heap");
    assert_eq!(status, 200);
    let (report, out) = tracer.stop();
    assert_eq!(
        report["end_reason"], "interrupted (SIGINT)",
        "{}",
        out.stderr
    );
    for stream in &mut held {
        let (status, body) = response(stream);
        assert_eq!(status, 503, "{body}");
        assert!(
            body.contains("s delta profile: no profile for the window"),
            "{body}"
        );
    }
}
