//! Growth over the heap's history (--interval): each heap shape
//! of growth.c (a steady leak, a cache that fills then stays flat, pure
//! churn) gets its trend in exact mode and at the default sample rate, the
//! leak's rate comes out right, --interval without `{n}` writes one report
//! carrying the history, and text and pprof show it.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    http::{get_text, served_addr},
    pprof::pprof,
    scratch,
    sites::{assert_no_losses, FP_FLAGS},
    JsonTracer, Target, Tracer,
};

/// growth.c's leak_grow: one 2048-byte block every 10 ms, by its own clock.
const LEAK_BYTES_PER_SEC: f64 = 204_800.0;
/// The trace: 12 s with a snapshot every 0.5 s (the cache fills in 3 s).
const TRACE: [&str; 4] = ["--interval", "0.5", "-d", "12"];

/// The JSON report of a 12-second trace of growth.c started by the tracer.
fn trace_growth(tag: &str, exact: bool) -> (Value, String) {
    let bin = compile_c("growth", tag, FP_FLAGS);
    let bin = bin.to_str().expect("utf-8 path");
    let mut args: Vec<&str> = TRACE.to_vec();
    args.extend(["--", bin, "60"]);
    let tracer = match exact {
        true => JsonTracer::start(tag, &args),
        false => JsonTracer::start_sampling(tag, &args),
    };
    let (report, out) = tracer.finish();
    (report, out.stderr)
}

/// Each of growth.c's functions' stack (the one that allocated most, should
/// an unwind have split it).
fn by_function(report: &Value) -> BTreeMap<&str, &Value> {
    let mut out: BTreeMap<&str, &Value> = BTreeMap::new();
    for stack in report["stacks"].as_array().expect("stacks") {
        let Some(f) = stack["frames"][0]["function"].as_str() else {
            continue;
        };
        let alloc = |s: &Value| s["alloc_bytes"].as_u64().unwrap_or(0);
        if out.get(f).is_none_or(|old| alloc(old) < alloc(stack)) {
            out.insert(f, stack);
        }
    }
    out
}

/// The history is whole: points every 0.5 s up to the report's time, and
/// every stack carries one value per point, the last one its in-use bytes
/// (a stack first seen after the last tick has none yet: no series, no
/// rate).
fn assert_history(report: &Value) {
    let points = report["snapshots"].as_array().expect("snapshots");
    assert!(
        (20..=26).contains(&points.len()),
        "24 ticks and the report's own point expected: {}",
        points.len()
    );
    let secs: Vec<f64> = points
        .iter()
        .map(|p| p["secs"].as_f64().expect("secs"))
        .collect();
    assert!(secs.windows(2).all(|w| w[0] < w[1]), "times rise: {secs:?}");
    assert_eq!(
        secs.last().copied(),
        report["duration_secs"].as_f64(),
        "last point is the report time"
    );
    let last = points.last().expect("a point");
    assert_eq!(last["inuse_bytes"], report["totals"]["inuse_bytes"]);
    let stacks = report["stacks"].as_array().expect("stacks");
    for stack in stacks {
        let series = stack["series"].as_array().expect("series");
        if series.is_empty() {
            assert!(stack["growth_bytes_per_sec"].is_null(), "{stack}");
            continue;
        }
        assert_eq!(series.len(), points.len(), "{stack}");
        assert_eq!(series.last(), Some(&stack["inuse_bytes"]), "{stack}");
        assert!(stack["growth_bytes_per_sec"].is_f64(), "{stack}");
    }
    for function in ["leak_grow", "cache_fill", "churn_spin"] {
        let series = &by_function(report)[function]["series"];
        assert_eq!(
            series.as_array().map(Vec::len),
            Some(points.len()),
            "{function}"
        );
    }
    // --sort growth is the default with --interval: fastest first, stacks
    // without a rate last.
    let rates: Vec<f64> = stacks
        .iter()
        .map(|s| {
            s["growth_bytes_per_sec"]
                .as_f64()
                .unwrap_or(f64::NEG_INFINITY)
        })
        .collect();
    assert!(
        rates.windows(2).all(|w| w[0] >= w[1]),
        "sorted by growth: {rates:?}"
    );
}

fn assert_trends(report: &Value, mode: &str) {
    let stacks = by_function(report);
    for (function, trend) in [
        ("leak_grow", "growing"),
        ("cache_fill", "plateau"),
        ("churn_spin", "churn"),
    ] {
        let stack = stacks
            .get(function)
            .unwrap_or_else(|| panic!("{mode}: no {function} stack: {report}"));
        assert_eq!(stack["trend"], trend, "{mode}: {function}: {stack}");
    }
}

#[test]
fn growth_classes_and_the_leak_rate_in_exact_mode_in_one_report_without_n() {
    let (report, stderr) = trace_growth("growth-exact", true);
    assert_no_losses(&report);
    assert_history(&report);
    assert_trends(&report, "exact");
    let leak = by_function(&report)["leak_grow"]["growth_bytes_per_sec"]
        .as_f64()
        .expect("leak rate");
    assert!(
        (leak - LEAK_BYTES_PER_SEC).abs() <= 0.1 * LEAK_BYTES_PER_SEC,
        "leak_grow grows {leak:.0} bytes/s, {LEAK_BYTES_PER_SEC} expected"
    );
    // -o without {n}: the final report only, written once.
    assert_eq!(stderr.matches("report written to").count(), 1, "{stderr}");
    assert!(!stderr.contains("snapshot"), "{stderr}");
}

#[test]
fn growth_classes_at_the_default_sample_rate() {
    let (report, _) = trace_growth("growth-sampled", false);
    assert_eq!(report["sample_rate"], 65536);
    assert_history(&report);
    assert_trends(&report, "sampled");
}

#[test]
fn text_and_pprof_show_each_stacks_rate_trend_and_sparkline() {
    let bin = compile_c("growth", "growth-render", FP_FLAGS);
    let target = Target::start(&bin, &["60"]);
    let pid = target.pid().to_string();
    let pb = scratch("growth-render.pb.gz");
    let args = ["--pid", &pid, "--interval", "0.5", "-d", "5"];
    let text = Tracer::start(&args);
    let mut pprof_args = args.to_vec();
    pprof_args.extend(["--format", "pprof", "-o", pb.to_str().expect("utf-8 path")]);
    let pprof_tracer = Tracer::start(&pprof_args);
    let text = text.finish();
    assert!(text.status.success(), "{}", text.stderr);
    let out = &text.stdout;
    assert!(out.contains("  history:    "), "{out}");
    assert!(out.contains("Top stacks by growth"), "{out}");
    // The leak's stack: its summary, then `+11.7 MiB/min, growing  ▁▂▃…`,
    // then its frames.
    let block = out
        .split("\n\n")
        .find(|b| b.contains("leak_grow ("))
        .unwrap_or_else(|| panic!("no leak_grow stack: {out}"));
    let rate_line = block.lines().nth(1).expect("a rate line");
    assert!(
        rate_line.contains(" MiB/min, growing  ") && rate_line.trim_start().starts_with('+'),
        "{rate_line}"
    );
    let spark = rate_line.rsplit("  ").next().expect("sparkline");
    assert!(
        spark.chars().count() >= 8 && spark.chars().all(|c| ('▁'..='█').contains(&c)),
        "{rate_line}"
    );
    assert!(
        spark.starts_with('▁') && spark.ends_with('█'),
        "a steady rise: {spark}"
    );
    let finished = pprof_tracer.finish();
    assert!(finished.status.success(), "{}", finished.stderr);
    let comments = pprof(&["-comments"], &pb);
    assert!(comments.contains("history: "), "{comments}");
    assert!(
        comments.lines().any(|l| l.starts_with("growth #")
            && l.contains("(growing)")
            && l.contains("leak_grow")),
        "{comments}"
    );
    let growing = pprof(&["-top", "-tagfocus", "trend=growing"], &pb);
    assert!(growing.contains("leak_grow"), "{growing}");
    assert!(!growing.contains("churn_spin"), "{growing}");
}

#[test]
fn serve_alone_records_the_history_every_5_s_for_the_live_profile() {
    let bin = compile_c("growth", "growth-serve", FP_FLAGS);
    let target = Target::start(&bin, &["60"]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("growth-serve", &["--pid", &pid, "--serve", "127.0.0.1:0"]);
    let addr = served_addr(&mut tracer);
    // The first tick is 5 s after the start: poll until a served profile
    // has it (a tick, then the profile's own point).
    let deadline = Instant::now() + Duration::from_secs(30);
    let live = loop {
        let (status, json) = get_text(&addr, "/profile.json");
        assert_eq!(status, 200, "{json}");
        let live: Value = serde_json::from_str(&json).expect("JSON profile");
        if live["snapshots"].as_array().is_some_and(|p| p.len() >= 2) {
            break live;
        }
        assert!(
            Instant::now() < deadline,
            "no history tick within 30 s: {live}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let first = live["snapshots"][0]["secs"].as_f64().expect("secs");
    assert!(
        first >= 5.0,
        "the first tick is due 5 s after the start: {first}"
    );
    let leak = live["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["growth_bytes_per_sec"].as_f64().is_some_and(|g| g > 0.0))
        .unwrap_or_else(|| panic!("no growing stack served: {live}"));
    assert_eq!(
        leak["series"].as_array().map(Vec::len),
        live["snapshots"].as_array().map(Vec::len)
    );
    let (report, _) = tracer.stop();
    assert!(
        report["snapshots"].as_array().is_some_and(|p| p.len() >= 2),
        "{}",
        report["snapshots"]
    );
    // Without --interval the order stays by in-use bytes.
    let inuse: Vec<u64> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| s["inuse_bytes"].as_u64().expect("inuse"))
        .collect();
    assert!(inuse.windows(2).all(|w| w[0] >= w[1]), "{inuse:?}");
}

/// full_cache.c's replacements, attached after its cache filled: the
/// entries they free are blocks the trace never saw allocated, whose sizes
/// glibc's chunk headers give.
#[test]
fn a_full_cache_attached_later_is_replacing_and_a_leak_beside_it_growing() {
    let bin = compile_c("full_cache", "full-cache", FP_FLAGS);
    let target = Target::start(&bin, &["60"]);
    let pid = target.pid().to_string();
    let args = ["--pid", &pid, "--interval", "0.5", "-d", "8"];
    let (report, _) = JsonTracer::start("full-cache", &args).finish();
    assert_no_losses(&report);
    let stacks = by_function(&report);
    let trend = |f: &str| {
        let stack = stacks
            .get(f)
            .unwrap_or_else(|| panic!("no {f} stack: {report}"));
        (stack["trend"].clone(), stack["alloc_objects"].as_u64())
    };
    let (replace, replaced) = trend("replace_entry");
    assert_eq!(replace, "replacing", "{report}");
    assert_eq!(trend("leak_slow").0, "growing", "{report}");
    // Each replacement freed one 2048-byte entry from before the trace:
    // a glibc chunk of 2064 bytes, 2056 of them usable. The kernel reads
    // the size of each free SEEN clears; the few whose SEEN slot a
    // reported block shares go to user space, which knows no size.
    let losses = &report["losses"];
    let (frees, bytes) = (
        losses["unknown_frees"].as_u64().expect("count"),
        losses["unknown_free_bytes"].as_u64().expect("bytes"),
    );
    let sized = bytes / 2056;
    assert_eq!(bytes % 2056, 0, "{losses}");
    assert!(sized <= frees && frees <= sized + 5, "{losses}");
    let replaced = replaced.expect("allocations");
    assert!(replaced >= 500 && frees + 1 >= replaced, "{losses}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("(glibc's chunk sizes)"), "{notes}");
    // Sampled, the sizes are not read: the cache reads as growing, and the
    // losses say no bytes.
    let (sampled, _) = JsonTracer::start_sampling("full-cache-sampled", &args).finish();
    assert_eq!(sampled["losses"]["unknown_free_bytes"], 0);
    drop(target);
}
