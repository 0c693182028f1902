//! `/metrics`: the Prometheus text format (version 0.0.4), so a dashboard
//! can alert on a heap that grows or on a tracer that loses events.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{report::Profile, trace_stats::TraceStats};

/// The metrics of one snapshot, with the trace's numbers when it was built.
pub fn render(p: &Profile, stats: &TraceStats) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let one = |v: u64| [(String::new(), v)];
    let t = &p.totals;
    metric("memtrace_inuse_bytes", "gauge",
        "Bytes allocated during the trace and still live (estimated from samples unless --sample-rate 1).",
        &one(t.inuse_bytes));
    metric(
        "memtrace_inuse_objects",
        "gauge",
        "Blocks allocated during the trace and still live.",
        &one(t.inuse_objects),
    );
    metric(
        "memtrace_allocated_bytes_total",
        "counter",
        "Bytes allocated since the trace started, freed or not.",
        &one(t.alloc_bytes),
    );
    metric(
        "memtrace_allocated_objects_total",
        "counter",
        "Blocks allocated since the trace started, freed or not.",
        &one(t.alloc_objects),
    );
    metric(
        "memtrace_not_freed_at_exit_bytes",
        "gauge",
        "Bytes that processes which exited during the trace had not freed.",
        &one(p.not_freed_at_exit.bytes),
    );
    metric(
        "memtrace_events_total",
        "counter",
        "Events from the BPF programs handled by the tracer.",
        &one(stats.events),
    );
    let losses: Vec<(String, u64)> = p
        .losses
        .lines()
        .iter()
        .map(|l| {
            (
                format!("{{counter=\"{}\",loss=\"{}\"}}", l.name, l.is_loss),
                l.count,
            )
        })
        .collect();
    metric(
        "memtrace_lost_total",
        "counter",
        "The loss counters of the report; loss=\"true\": data missing from the profile.",
        &losses,
    );
    metric(
        "memtrace_process_inuse_bytes",
        "gauge",
        "Live bytes per traced process.",
        &per_process(p),
    );
    metric(
        "memtrace_sample_rate_bytes",
        "gauge",
        "Mean bytes between recorded allocations (1: every allocation).",
        &one(p.sample_rate),
    );
    write_own(&mut out, p.duration_secs);
    out
}

/// The tracer's own gauges: how long it has traced, its CPU and memory.
fn write_own(out: &mut String, duration_secs: f64) {
    let (cpu, rss) = tracer_usage();
    let _ = writeln!(
        out,
        "# HELP memtrace_trace_seconds Seconds since the trace started."
    );
    let _ = writeln!(out, "# TYPE memtrace_trace_seconds gauge");
    let _ = writeln!(out, "memtrace_trace_seconds {:.3}", duration_secs);
    let _ = writeln!(
        out,
        "# HELP process_cpu_seconds_total CPU seconds the tracer used (user and system)."
    );
    let _ = writeln!(out, "# TYPE process_cpu_seconds_total counter");
    let _ = writeln!(out, "process_cpu_seconds_total {cpu:.3}");
    let _ = writeln!(
        out,
        "# HELP process_resident_memory_bytes The tracer's resident memory."
    );
    let _ = writeln!(out, "# TYPE process_resident_memory_bytes gauge");
    let _ = writeln!(out, "process_resident_memory_bytes {rss}");
}

/// Live bytes per process, labelled with its pid and program.
fn per_process(p: &Profile) -> Vec<(String, u64)> {
    let mut live: BTreeMap<u32, u64> = p.processes.iter().map(|q| (q.pid, 0)).collect();
    for s in &p.stacks {
        *live.entry(s.pid).or_default() += s.counts.inuse_bytes;
    }
    let program = |pid: u32| {
        p.processes
            .iter()
            .find(|q| q.pid == pid)
            .map_or("", |q| q.program.as_str())
    };
    live.into_iter()
        .map(|(pid, bytes)| {
            (
                format!("{{pid=\"{pid}\",program=\"{}\"}}", label(program(pid))),
                bytes,
            )
        })
        .collect()
}

/// A label value as the text format wants it. The traced process chose
/// its program name: controls (ESC, BEL, C1), bidirectional overrides and
/// newlines are first made visible escapes like in every other output
/// (`escape::text`, so a scraped page shown in a terminal cannot drive
/// it), then backslash, quote and newline are escaped as the exposition
/// format requires (a parser gives back `escape::text`'s string).
fn label(text: &str) -> String {
    let visible = crate::escape::text(text);
    let mut out = String::with_capacity(visible.len());
    for c in visible.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The tracer's CPU seconds and resident bytes.
fn tracer_usage() -> (f64, u64) {
    let u = crate::usage::own();
    (u.cpu_secs(), u.rss_kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_escape_what_the_process_chose() {
        // The exposition format's three escapes, over escape::text's
        // visible form (a newline is `\n` there, a backslash `\\`).
        assert_eq!(label("a\"b"), "a\\\"b");
        assert_eq!(label("a\\c"), "a\\\\\\\\c");
        assert_eq!(label("a\nd"), "a\\\\nd");
    }

    #[test]
    fn labels_hold_no_control_or_reordering_character() {
        let hostile = "/tmp/ho\x1b[31mstile\x07\u{9b}2J\u{202e}x\ty";
        let got = label(hostile);
        assert!(!got.chars().any(crate::escape::is_hidden), "{got:?}");
        assert_eq!(
            got,
            "/tmp/ho\\\\x1b[31mstile\\\\x07\\\\u{9b}2J\\\\u{202e}x\\\\ty"
        );
    }
}
