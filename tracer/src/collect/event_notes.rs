//! The notes about events: frees of blocks the trace never saw allocated,
//! what a full ring buffer did to the numbers, and what lost or malformed
//! events left behind.

use crate::report::{counted, was, Losses};

use super::{collector::Collector, profile::Meta};

/// Frees of older blocks, and what lost or malformed events left behind.
pub(super) fn event_notes(meta: &Meta, collector: &Collector, losses: &Losses) -> Vec<String> {
    let mut notes = Vec::new();
    if losses.unknown_frees > 0 {
        notes.push(unknown_frees_note(meta, losses));
    }
    if losses.ringbuf_full > 0 {
        notes.push(ringbuf_note(losses));
    }
    if collector.state.heap.replaced_allocs > 0 {
        let n = collector.state.heap.replaced_allocs;
        notes.push(format!(
            "{} reused an address whose free was not seen (lost events)",
            counted(n, "allocation", "allocations")
        ));
    }
    if collector.state.heap.unmatched_frees > 0 || collector.state.malformed_events > 0 {
        let (frees, malformed) = (
            collector.state.heap.unmatched_frees,
            collector.state.malformed_events,
        );
        notes.push(format!(
            "{} without a recorded allocation and {} reached user space",
            counted(frees, "free", "frees"),
            counted(malformed, "malformed event", "malformed events")
        ));
    }
    notes
}

/// What a full ring buffer did to the numbers (raise --ringbuf-mb).
fn ringbuf_note(losses: &Losses) -> String {
    let dropped = losses.ringbuf_full;
    let frees = losses.frees_dropped.min(dropped);
    let others = dropped - frees;
    format!(
        "the ring buffer was full (raise --ringbuf-mb): {} dropped. In-use may be overstated: \
         {} among them, whose blocks still count as in use. The other {} (allocations, \
         process events) are missing from the report; {} of blocks whose allocation event was \
         dropped {} counted apart from frees of blocks allocated before the trace",
        counted(dropped, "event was", "events were"),
        counted(frees, "free was", "frees were"),
        others,
        counted(losses.frees_of_dropped_allocs, "free", "frees"),
        was(losses.frees_of_dropped_allocs)
    )
}

/// What the frees of blocks the trace never saw allocated are. Measured
/// with glibc 2.36 (a 64-thread program: 2 per thread; ripgrep: all but a
/// few): tcache_thread_shutdown() at each thread's exit frees the thread's
/// cache, which _int_malloc allocated without going through malloc, and
/// every block still in it, which the program had freed already.
fn unknown_frees_note(meta: &Meta, losses: &Losses) -> String {
    let n = losses.unknown_frees;
    let before = if meta.traced_from_start {
        ""
    } else {
        "blocks allocated before the trace started, "
    };
    let untracked = if losses.live_map_full > 0 {
        ", blocks not tracked because the live map was full"
    } else {
        ""
    };
    format!(
        "{} of blocks the trace never saw allocated {} ignored (not a loss): {before}the \
         allocator's own memory (with glibc, each exiting thread hands back its cache of freed \
         blocks: the cache, allocated inside malloc, and the blocks in it, which the program \
         had freed already){untracked}",
        counted(n, "free", "frees"),
        was(n)
    )
}
