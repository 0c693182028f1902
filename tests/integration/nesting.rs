//! Allocator calls nested in one thread (a signal handler's inside an
//! interrupted malloc), ring-buffer losses counted apart from frees of
//! unseen blocks, and what the unknown frees of a traced command are.

use std::ffi::OsStr;

use crate::harness::{
    compile_c, inuse_from,
    process::state_file,
    sites::{FP_FLAGS, O2_FLAGS},
    JsonTracer, Target, Tracer,
};

#[test]
fn every_allocation_of_a_signal_handler_that_interrupts_malloc_is_recorded() {
    let bin = compile_c("signal_alloc", "fp", FP_FLAGS);
    for sessions in ["auto", "off"] {
        let state = state_file(&format!("signal-alloc-{sessions}"));
        let args = [
            OsStr::new("--uprobe-sessions"),
            OsStr::new(sessions),
            OsStr::new("--"),
            bin.as_os_str(),
            state.as_os_str(),
        ];
        let (report, _) = JsonTracer::spawn(&format!("signal-alloc-{sessions}"), &args).finish();
        let kept = std::fs::read_to_string(&state).expect("the target wrote its counts");
        let kept: Vec<u64> = kept
            .split_whitespace()
            .map(|n| n.parse().expect("a number"))
            .collect();
        assert_eq!(
            inuse_from(&report, "on_alarm"),
            (kept[0], kept[1]),
            "sessions {sessions}: the handler's blocks; losses {}",
            report["losses"]
        );
        for (name, count) in report["losses"].as_object().expect("losses") {
            assert_eq!(
                count, 0,
                "sessions {sessions}: {name} in {}",
                report["losses"]
            );
        }
    }
}

/// A 1 MiB ring buffer and 400000 events: frees whose FREE was dropped
/// leave blocks in use, which the report says; frees of blocks whose ALLOC
/// was dropped are counted apart from unknown ones.
#[test]
fn a_full_ring_buffer_says_in_use_may_be_overstated_and_counts_its_frees_apart() {
    let bin = compile_c("overflow", "fp", FP_FLAGS);
    let bin = bin.to_str().expect("utf-8 path");
    // dwarf: each ALLOC event carries a stack copy, so the buffer fills
    // often and both kinds of events are dropped (with --unwind tables the
    // events are small, and which kind finds the buffer full is timing).
    let args = ["--ringbuf-mb", "1", "--unwind", "dwarf", "--", bin];
    let (report, _) = JsonTracer::spawn("overflow", &args).finish();
    let losses = &report["losses"];
    let get = |name: &str| losses[name].as_u64().expect(name);
    let (full, frees, of_dropped) = (
        get("ringbuf_full"),
        get("frees_dropped"),
        get("frees_of_dropped_allocs"),
    );
    assert!(full > 0, "the buffer overflowed: {losses}");
    // The target frees every block: each dropped ALLOC (all dropped events
    // but the FREEs and, maybe, the process's exit) is freed later.
    assert!(
        of_dropped + frees <= full && of_dropped + frees + 1 >= full,
        "{losses}"
    );
    assert_eq!(get("unknown_frees"), 0, "{losses}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("In-use may be overstated"), "{notes}");

    let text = Tracer::spawn(&["--ringbuf-mb", "1", "--unwind", "dwarf", "--", bin]).finish();
    assert!(text.status.success(), "{}", text.stderr);
    assert!(
        text.stdout.contains("WARNING: in-use may be overstated: "),
        "{}",
        text.stdout
    );
    // The last line on stderr says so too, with the counter's name.
    let last = text.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("WARNING: ") && last.contains("lost (ringbuf_full "),
        "{}",
        text.stderr
    );
}

/// The same in tables mode, the default (small events: the buffer fills
/// only when the reader falls behind): the tracer is stopped (SIGSTOP)
/// while 32 threads make 64,000 malloc/free pairs 64 calls deep, far more
/// than 1 MiB holds, so the buffer surely overflows; the report says
/// in-use may be overstated.
#[test]
fn a_full_ring_buffer_in_tables_mode_says_in_use_may_be_overstated() {
    let bin = compile_c("big_frames", "O2-overflow", O2_FLAGS);
    let mut target = Target::start(&bin, &["2000"]);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start("overflow-tables", &["--pid", &pid, "--ringbuf-mb", "1"]);
    tracer.signal(libc::SIGSTOP);
    target.run_sites();
    tracer.signal(libc::SIGCONT);
    let (report, _) = tracer.stop();
    assert_eq!(report["unwind"], "tables");
    let full = report["losses"]["ringbuf_full"]
        .as_u64()
        .expect("ringbuf_full");
    assert!(full > 0, "the buffer overflowed: {}", report["losses"]);
    let notes = report["notes"].to_string();
    assert!(notes.contains("In-use may be overstated"), "{notes}");
}

/// A command traced from its first instruction has no blocks from before
/// the trace: its unknown frees (2 per exiting thread with glibc: its
/// cache and a block in it) are said to be the allocator's own.
#[test]
fn unknown_frees_of_a_command_are_not_said_to_be_from_before_the_trace() {
    let bin = compile_c("threads_exit", "fp", FP_FLAGS);
    let bin = bin.to_str().expect("utf-8 path");
    let (report, _) = JsonTracer::spawn("threads-exit", &["--", bin]).finish();
    let unknown = report["losses"]["unknown_frees"].as_u64().expect("count");
    assert!(unknown >= 16, "{}", report["losses"]);
    let notes = report["notes"].to_string();
    assert!(!notes.contains("before"), "{notes}");
    assert!(
        notes.contains("never saw allocated") && notes.contains("each exiting thread"),
        "{notes}"
    );
}
