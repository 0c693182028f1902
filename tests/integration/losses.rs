//! A loss the kernel counts reaches the report under its own name: in the
//! JSON `losses` object, and in the text footer with its remedy and in the
//! total of events lost.

use crate::harness::{compile_c, sites::FP_FLAGS, JsonTracer, Target, Tracer};

/// The number on the text footer's line for counter `name`.
fn footer_count(text: &str, name: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} line in:\n{text}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"))
}

/// With room for 16 live blocks, the sites target (hundreds of blocks kept)
/// fills the live map: only `live_map_full` counts it, and the text report
/// says how to avoid it and counts it as lost.
#[test]
fn a_full_live_map_is_counted_as_live_map_full_with_its_remedy() {
    let bin = compile_c("sites", "losses-live-full", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let args = ["--pid", pid.as_str(), "--max-live", "16"];
    let json = JsonTracer::start("losses-live-full", &args);
    let text = Tracer::start(&args);
    target.run_sites();
    let (report, _) = json.stop();
    text.signal(libc::SIGINT);
    let text = text.finish();
    assert!(text.status.success(), "tracer failed: {}", text.stderr);

    let losses = &report["losses"];
    let full = losses["live_map_full"].as_u64().expect("live_map_full");
    assert!(full > 0, "{losses}");
    for other in [
        "ringbuf_full",
        "stack_lost",
        "inflight_full",
        "read_failed",
        "stale_inflight",
    ] {
        assert_eq!(losses[other], 0, "{other} in {losses}");
    }

    let out = &text.stdout;
    let full = footer_count(out, "live_map_full");
    assert!(full > 0, "{out}");
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("live_map_full "))
        .unwrap_or_default();
    assert!(line.ends_with("(raise --max-live)"), "{line}");
    assert_eq!(footer_count(out, "ringbuf_full"), 0, "{out}");
    assert!(
        out.contains(&format!("WARNING: {full} event")),
        "the total is the live_map_full count:\n{out}"
    );
}

/// A forking server's workers free the blocks their parent allocated
/// before the trace (as postgres' backends do): in exact mode those frees
/// cost no ring-buffer event (tracer-ebpf free.rs, SEEN), are counted as
/// frees of blocks the trace never saw allocated, and lose nothing.
#[test]
fn frees_of_blocks_allocated_before_the_trace_cost_no_event() {
    const BLOCKS: u64 = 200_000;
    const WORKERS: u64 = 4;
    let bin = compile_c("inherited_frees", "O2", &["-O2"]);
    let mut target = Target::start(&bin, &[&BLOCKS.to_string(), &WORKERS.to_string()]);
    let pid = target.pid().to_string();
    let args = ["--pid", pid.as_str(), "--follow-forks", "--verbose"];
    let json = JsonTracer::start("inherited-frees", &args);
    target.run_sites();
    let (report, finished) = json.stop();
    let losses = &report["losses"];
    assert!(
        losses["unknown_frees"].as_u64() >= Some(WORKERS * BLOCKS),
        "{losses}"
    );
    assert_eq!(losses["ringbuf_full"], 0, "{losses}");
    let line = finished
        .stderr
        .lines()
        .find(|l| l.contains("free events read: "))
        .unwrap_or_else(|| panic!("no free events line in:\n{}", finished.stderr));
    let read: u64 = line
        .split("free events read: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    // The workers' own 7777-byte blocks, what fork and exit free, and
    // frees whose address shares a slot with a block reported: far fewer
    // than the frees of inherited blocks.
    assert!(read < WORKERS * BLOCKS / 20, "{line}");
    let last = finished
        .stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default();
    assert!(!last.contains("lost"), "{}", finished.stderr);
}
