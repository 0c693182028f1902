//! The notes about events: frees of blocks the trace never saw allocated,
//! what a full ring buffer did to the numbers, and what lost or malformed
//! events left behind.

use tracer_common::counter;

use crate::profile::{Losses, Note};

use super::{collector::Collector, meta::Meta};

/// Frees of older blocks, and what lost or malformed events left behind.
pub(super) fn event_notes(meta: &Meta, collector: &Collector, losses: &Losses) -> Vec<Note> {
    let mut notes = Vec::new();
    if losses.get(counter::UNKNOWN_FREE) > 0 {
        notes.push(Note::UnknownFrees {
            frees: losses.get(counter::UNKNOWN_FREE),
            bytes: losses.get(counter::UNKNOWN_FREE_BYTES),
            traced_from_start: meta.traced_from_start,
            live_map_full: losses.get(counter::LIVE_MAP_FULL) > 0,
        });
    }
    if losses.get(counter::RINGBUF_FULL) > 0 {
        notes.push(Note::RingbufFull {
            dropped: losses.get(counter::RINGBUF_FULL),
            frees_dropped: losses.get(counter::FREE_DROPPED),
            frees_of_dropped_allocs: losses.get(counter::FREE_OF_DROPPED_ALLOC),
        });
    }
    let heap = &collector.state.heap();
    if heap.replaced_allocs > 0 {
        notes.push(Note::ReusedAddresses {
            allocations: heap.replaced_allocs,
        });
    }
    let state = &collector.state;
    if state.unmatched_frees() > 0 || state.malformed_events() > 0 {
        notes.push(Note::UnmatchedFrees {
            frees: state.unmatched_frees(),
            malformed: collector.state.malformed_events(),
        });
    }
    notes
}
