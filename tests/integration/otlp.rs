//! `--otlp`: profiles pushed to a loopback receiver that decodes them with
//! the official `opentelemetry-proto` package (harness/otlp_receiver.py):
//! exact per-site numbers per sample type, resource attributes, headers
//! from the environment; a receiver that refuses, then accepts; one that
//! never answers; bad URLs; a token in the URL sent but never shown.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

use crate::harness::{
    compile_c,
    otlp::Receiver,
    pprof::pprof,
    scratch,
    sites::{assert_sites_exact, EXPECTED_PER_THREAD, O0_FLAGS, THREADS},
    JsonTracer, Target, TRACER,
};

const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("inuse_space", "bytes"),
    ("inuse_objects", "count"),
    ("alloc_space", "bytes"),
    ("alloc_objects", "count"),
];

/// The resource of process `pid` in a decoded request.
pub(crate) fn resource(request: &Value, pid: u32) -> &Value {
    request["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["attributes"]["process.pid"] == pid)
        .unwrap_or_else(|| panic!("no resource with process.pid {pid}: {request}"))
}

/// Per leaf function, [inuse bytes, inuse objects, alloc bytes, alloc
/// objects] summed over the resource's four profiles.
fn per_site(resource: &Value) -> BTreeMap<String, [u64; 4]> {
    let profiles = resource["profiles"].as_array().expect("profiles");
    let kinds: Vec<(&str, &str)> = profiles
        .iter()
        .map(|p| {
            (
                p["sample_type"].as_str().unwrap_or(""),
                p["unit"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(kinds, SAMPLE_TYPES, "one profile per sample type");
    let mut sums: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for (i, p) in profiles.iter().enumerate() {
        assert_eq!(p["period_type"], serde_json::json!(["space", "bytes"]));
        assert_eq!(p["scope"], "memtrace-bpf");
        for s in p["samples"].as_array().expect("samples") {
            let leaf = s["frames"][0].as_str().expect("a leaf frame").to_string();
            let value = s["values"][0].as_u64().expect("one value");
            sums.entry(leaf).or_default()[i] += value;
        }
    }
    sums
}

fn assert_exact(resource: &Value) {
    let got = per_site(resource);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS);
        // Sites that keep nothing and allocate nothing have no sample.
        let got = got.get(*site).copied().unwrap_or_default();
        assert_eq!(
            got, want,
            "{site}: [inuse bytes, inuse objects, alloc bytes, alloc objects]"
        );
    }
}

/// The report's OTLP note.
fn otlp_note(report: &Value) -> String {
    report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.starts_with("OTLP: "))
        .unwrap_or_else(|| panic!("no OTLP note in {}", report["notes"]))
        .to_string()
}

#[test]
fn a_pushed_profile_decodes_to_the_exact_numbers_per_site() {
    let bin = compile_c("sites", "otlp", O0_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let receiver = Receiver::start("otlp-exact", 0);
    let pid = target.pid().to_string();
    let url = receiver.url();
    let tracer = JsonTracer::start_with_env(
        "otlp-exact",
        &["--pid", pid.as_str(), "--otlp", url.as_str()],
        &[
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "x-scope-orgid=tenant%201,x-other=2",
            ),
            (
                "OTEL_EXPORTER_OTLP_PROFILES_HEADERS",
                "x-scope-orgid=tenant%202",
            ),
        ],
    );
    target.run_sites();
    let (report, out) = tracer.stop();
    assert_sites_exact(&report);
    let request = receiver.request(1);
    assert_eq!(request["path"], "/v1development/profiles");
    assert_eq!(request["content_type"], "application/x-protobuf");
    // The profiles' own list replaces the general one, decoded.
    assert_eq!(request["headers"]["x-scope-orgid"], "tenant 2");
    assert!(
        request["headers"].get("x-other").is_none(),
        "{}",
        request["headers"]
    );
    for (table, ok) in request["zero_entries"].as_object().expect("zero entries") {
        assert_eq!(ok, true, "{table}_table[0] is not the zero value");
    }
    let r = resource(&request, target.pid());
    assert_exact(r);
    let attrs = &r["attributes"];
    assert!(
        attrs["process.executable.path"]
            .as_str()
            .is_some_and(|p| p.ends_with("sites-otlp")),
        "{attrs}"
    );
    assert_eq!(attrs["process.executable.name"], "sites-otlp");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(attrs["host.name"], host.trim());
    assert_eq!(attrs["service.name"], "unknown_service:sites-otlp");
    let p = &r["profiles"][0];
    assert_eq!(p["period"], 1, "exact mode: period 1");
    assert!(p["duration_nano"].as_u64().is_some_and(|d| d > 0));
    assert_eq!(
        otlp_note(&report),
        format!("OTLP: 1 profile sent to {url}/v1development/profiles")
    );
    assert!(
        out.stderr.contains("OTLP: 1 profile sent to"),
        "the end says what was pushed: {}",
        out.stderr
    );
}

#[test]
fn a_collector_that_refuses_then_accepts_gets_the_profile() {
    let bin = compile_c("sites", "otlp-retry", O0_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let mut receiver = Receiver::start("otlp-retry", 2);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start_with_env(
        "otlp-retry",
        &["--pid", pid.as_str(), "--otlp", "--interval", "0.5"],
        // --otlp without a URL: the profiles' own endpoint, used as-is.
        &[
            (
                "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT",
                &format!("{}/v1development/profiles", receiver.url()),
            ),
            // Resource attributes from the environment, as SDKs read them.
            ("OTEL_SERVICE_NAME", "checkout"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,team=heap%20watchers",
            ),
        ],
    );
    target.run_sites();
    receiver.stdout.wait_for("refused 2", "the second refusal");
    // A tick's profile, retried after two refusals, gets through.
    receiver
        .stdout
        .wait_for("accepted 1", "a push after the refusals");
    let (report, out) = tracer.stop();
    assert_sites_exact(&report);
    let sent = receiver.accepted();
    let note = otlp_note(&report);
    // Every refusal is counted; a push still queued when the end's wait is
    // over (a loaded machine) would be counted as dropped, not lost.
    assert!(
        note.contains(&format!("OTLP: {sent} profiles sent to "))
            && note.contains("; 2 failed sends, "),
        "{note}"
    );
    assert!(
        out.stderr
            .contains("failed: HTTP 503; retrying with backoff"),
        "{}",
        out.stderr
    );
    // The final report goes first at the end: the push covering the
    // longest time is there, with the exact numbers.
    let last = (1..=sent)
        .map(|n| receiver.request(n))
        .max_by_key(|r| resource(r, target.pid())["profiles"][0]["duration_nano"].as_u64())
        .expect("a request");
    let r = resource(&last, target.pid());
    assert_exact(r);
    let attrs = &r["attributes"];
    assert_eq!(attrs["service.name"], "checkout", "{attrs}");
    assert_eq!(attrs["deployment.environment"], "prod", "{attrs}");
    assert_eq!(attrs["team"], "heap watchers", "{attrs}");
}

#[test]
fn a_collector_that_never_answers_does_not_hold_the_trace() {
    // Connections complete in the listener's backlog; nobody answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://127.0.0.1:{}",
        silent.local_addr().expect("bound").port()
    );
    let bin = compile_c("sites", "otlp-silent", O0_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start(
        "otlp-silent",
        &[
            "--pid",
            pid.as_str(),
            "--otlp",
            url.as_str(),
            "--interval",
            "0.5",
        ],
    );
    target.run_sites();
    let stopped = Instant::now();
    let (report, out) = tracer.stop();
    // Shown with --nocapture: what the end's bounded wait cost.
    println!(
        "SIGINT to exit with a silent collector: {:?}",
        stopped.elapsed()
    );
    assert_sites_exact(&report);
    assert!(
        out.stderr.contains("OTLP: waiting at most 3 s for"),
        "{}",
        out.stderr
    );
    let note = otlp_note(&report);
    assert!(
        note.starts_with(&format!("OTLP: 0 profiles sent to {url}")),
        "{note}"
    );
    let dropped: u64 = note
        .rsplit_once(" dropped")
        .and_then(|(head, _)| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a dropped count in {note}"));
    assert!(dropped >= 1, "{note}");
    assert!(
        out.stderr.contains("warning: OTLP: 0 profiles sent"),
        "{}",
        out.stderr
    );
    drop(silent);
}

/// A collector that refuses with a body of its own choosing: the warning
/// quotes it escaped once (`bad\x1b[2J\nforged`), on one line.
#[test]
fn a_refusal_body_is_quoted_escaped_once() {
    use std::io::{BufRead as _, BufReader, Read as _, Write as _};
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "http://127.0.0.1:{}",
        listener.local_addr().expect("bound").port()
    );
    // Answers every request 400, with the hostile body.
    let server = std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0usize;
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 2 {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let _ = reader.take(length as u64).read_to_end(&mut Vec::new());
            let body = "bad\x1b[2J\nforged";
            let _ = write!(
                stream,
                "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let out = Command::new(TRACER)
        .args(["--otlp", url.as_str(), "-d", "1", "--", "/bin/true"])
        .output()
        .expect("run memtrace-bpf");
    let err = String::from_utf8_lossy(&out.stderr);
    let warning = err
        .lines()
        .find(|l| l.contains("failed: HTTP 400"))
        .unwrap_or_else(|| panic!("no refusal said: {err}"));
    assert!(
        warning.contains("HTTP 400: bad\\x1b[2J\\nforged; not retried"),
        "{warning}"
    );
    assert!(!err.contains('\x1b'), "{err}");
    drop(server);
}

/// Arguments, environment, and what the error must say.
type BadCase = (
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
);

#[test]
fn bad_otlp_urls_are_refused_before_anything_is_attached() {
    let cases: [BadCase; 5] = [
        (
            &["--otlp", "https://collector:4318"],
            &[],
            "https:// is not supported",
        ),
        (
            &["--otlp", "collector:4318"],
            &[],
            "write it as http://HOST:PORT",
        ),
        (
            &["--otlp"],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:99999")],
            "OTEL_EXPORTER_OTLP_ENDPOINT \"http://c:99999\": port \"99999\"",
        ),
        (
            &["--otlp", "http://c"],
            &[("OTEL_EXPORTER_OTLP_HEADERS", "x=a%0d%0aInjected:%201")],
            "OTEL_EXPORTER_OTLP_HEADERS: the value of x is not valid",
        ),
        // A second Content-Length would frame the request two ways.
        (
            &["--otlp", "http://c"],
            &[("OTEL_EXPORTER_OTLP_HEADERS", "x=1,Content-Length=0")],
            "OTEL_EXPORTER_OTLP_HEADERS: \"Content-Length\" is a header memtrace-bpf sets itself",
        ),
    ];
    for (args, env, message) in cases {
        let out = Command::new(TRACER)
            .args(args)
            .args(["--pid", "1", "-d", "1"])
            .envs(env.iter().copied())
            .output()
            .expect("run the tracer");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.starts_with("memtrace-bpf: error: "), "{stderr}");
        assert!(stderr.contains(message), "{args:?} {env:?}: {stderr}");
        assert!(!stderr.contains("tracing "), "nothing attached: {stderr}");
    }
}

/// A token in the URL's query goes to the collector, and is shown nowhere:
/// not on stderr, not in the report's note, not in pprof's comments.
#[test]
fn a_token_in_the_url_is_sent_but_never_shown() {
    const TOKEN: &str = "s3cret-t0ken";
    let bin = compile_c("sites", "otlp-token", O0_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let receiver = Receiver::start("otlp-token", 0);
    let pid = target.pid().to_string();
    let url = format!(
        "{}/v1development/profiles?tenant=a&token={TOKEN}",
        receiver.url()
    );
    let tracer = JsonTracer::start(
        "otlp-token",
        &["--pid", pid.as_str(), "--otlp", url.as_str(), "--verbose"],
    );
    target.run_sites();
    let (report, out) = tracer.stop();
    assert_sites_exact(&report);
    assert_eq!(
        receiver.request(1)["path"],
        format!("/v1development/profiles?tenant=a&token={TOKEN}")
    );
    let shown = format!(
        "{}/v1development/profiles?tenant=REDACTED&token=REDACTED",
        receiver.url()
    );
    assert_eq!(
        otlp_note(&report),
        format!("OTLP: 1 profile sent to {shown}")
    );
    assert!(out.stderr.contains(&shown), "{}", out.stderr);
    assert!(!out.stderr.contains(TOKEN), "{}", out.stderr);
    // The file JsonTracer had the tracer write.
    let saved = scratch("otlp-token.json");
    let text = std::fs::read_to_string(&saved).expect("the JSON report");
    assert!(!text.contains(TOKEN), "the JSON report");
    let pb = scratch("otlp-token.pb.gz");
    let rendered = Command::new(TRACER)
        .arg("report")
        .arg(&saved)
        .args(["-f", "pprof", "-o"])
        .arg(&pb)
        .output()
        .expect("run memtrace-bpf report");
    assert!(rendered.status.success(), "{rendered:?}");
    let comments = pprof(&["-comments"], &pb);
    assert!(comments.contains(&shown), "{comments}");
    assert!(!comments.contains(TOKEN), "{comments}");
}
