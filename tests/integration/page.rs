//! The live page (`--serve`'s `/`) in headless Chromium
//! while a program leaks: what a person sees names the leaking function.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    time::{Duration, Instant},
};

use crate::harness::{
    chromium, compile_c,
    http::{get_text, served_addr},
    parse_report, JsonTracer, Target,
};

/// The response head of a GET of `path`.
fn head(addr: &str, path: &str) -> String {
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
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

/// Waits until the live profile holds a block from `function` (the trace
/// sees the leak), polling /profile.json; panics after a minute.
fn wait_for_leak(addr: &str, function: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get_text(addr, "/profile.json");
        assert_eq!(status, 200, "{body}");
        let profile = parse_report(&body);
        let seen = profile["stacks"].as_array().is_some_and(|stacks| {
            stacks.iter().any(|s| {
                s["inuse_bytes"].as_u64() > Some(0)
                    && s["frames"][0]["function"].as_str() == Some(function)
            })
        });
        if seen {
            return;
        }
        assert!(Instant::now() < deadline, "no {function} stack: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_live_page_names_the_leaking_function_in_headless_chromium() {
    // 20 KB a second in 1000-byte blocks from leak_block, churn beside it,
    // for up to 10 minutes (the test ends it).
    let bin = compile_c("soak_leak", "page", &["-O2", "-g"]);
    let mut target = Target::start(&bin, &["2000", "1", "20000", "1000", "600"]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("page", &["--pid", &pid, "--serve", "127.0.0.1:0"]);
    let addr = served_addr(&mut tracer);
    target.send("go");
    wait_for_leak(&addr, "leak_block");

    let head = head(&addr, "/");
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    assert!(
        head.contains("content-security-policy: default-src 'none';"),
        "{head}"
    );

    // Less virtual time than the page's refresh, so it is not reloaded.
    let budget = Duration::from_secs(1);
    let url = format!("http://{addr}/");
    let text = chromium::page_text(&chromium::dump_dom(&url, budget));
    assert!(text.contains(&format!("memtrace-bpf: pid {pid}")), "{text}");
    assert!(
        text.contains("leak_block"),
        "the page does not name leak_block: {text}"
    );
    assert!(text.contains("In-use bytes over time"), "{text}");
    // The inline flamegraph shows no control that only its script made
    // work, and its root row is labelled.
    for dead in ["Search", "Reset Zoom"] {
        assert!(!text.contains(dead), "{dead} on the page: {text}");
    }
    assert!(text.contains(" all ("), "no root label: {text}");
    // Each endpoint is listed.
    for endpoint in [
        "/debug/pprof/heap",
        "/metrics",
        "/profile.json",
        "/flamegraph.svg",
    ] {
        assert!(
            text.contains(endpoint),
            "{endpoint} not on the page: {text}"
        );
    }
    // The growth flamegraph names it too (by growth with history, else by
    // in-use bytes, saying that there is no history yet).
    let growth = format!("http://{addr}/?flame=growth");
    let text = chromium::page_text(&chromium::dump_dom(&growth, budget));
    assert!(text.contains("leak_block"), "{text}");
    let shot = chromium::artefact("live-page.png");
    chromium::screenshot(&url, budget, &shot, 1280, 1400);

    let (status, body) = get_text(&addr, "/?flame=nope");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("inuse or growth"), "{body}");
    let (report, _) = tracer.stop();
    assert!(
        report["stacks"].as_array().is_some_and(|s| !s.is_empty()),
        "{report}"
    );
}
