//! The `--serve` endpoint: its address, plain HTTP GETs, and reading
//! its pprof text.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    time::Duration,
};

use super::{compile_c, sites::O2_FLAGS, JsonTracer, Target, Tracer};

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
        // Go's four values, then the peak's two (summed: the first four).
        if values.len() == 6 && leaf.is_some_and(|l| locations.contains(&l)) {
            for (s, v) in sum.iter_mut().zip(values) {
                *s += v;
            }
        }
    }
    sum
}

/// Samples as `name{k=v,...} value` lines, from the Prometheus client
/// library's own parser (Debian's python3-prometheus-client).
pub(crate) fn parse_prometheus(text: &str) -> String {
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
    assert!(
        out.status.success(),
        "not Prometheus text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}
