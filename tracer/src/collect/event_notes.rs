//! The notes about events: frees of blocks the trace never saw allocated,
//! what a full ring buffer did to the numbers, and what lost or malformed
//! events left behind.

use crate::profile::{Losses, Note};

use super::{collector::Collector, meta::Meta};

/// Frees of older blocks, and what lost or malformed events left behind.
pub(super) fn event_notes(meta: &Meta, collector: &Collector, losses: &Losses) -> Vec<Note> {
    let mut notes = Vec::new();
    if losses.unknown_frees > 0 {
        notes.push(Note::UnknownFrees {
            frees: losses.unknown_frees,
            bytes: losses.unknown_free_bytes,
            traced_from_start: meta.traced_from_start,
            live_map_full: losses.live_map_full > 0,
        });
    }
    if losses.ringbuf_full > 0 {
        notes.push(Note::RingbufFull {
            dropped: losses.ringbuf_full,
            frees_dropped: losses.frees_dropped,
            frees_of_dropped_allocs: losses.frees_of_dropped_allocs,
        });
    }
    let heap = &collector.state.heap;
    if heap.replaced_allocs > 0 {
        notes.push(Note::ReusedAddresses {
            allocations: heap.replaced_allocs,
        });
    }
    let state = &collector.state;
    if state.unmatched_frees > 0 || state.malformed_events > 0 {
        notes.push(Note::UnmatchedFrees {
            frees: state.unmatched_frees,
            malformed: collector.state.malformed_events,
        });
    }
    notes
}
