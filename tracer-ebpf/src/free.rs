//! free(): when sampling, only blocks found in LIVE are reported, so a
//! free of an unrecorded block costs one hash operation. In exact mode
//! every block is reported, so every free is too, without a LIVE
//! operation: user space matches it to its block.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, programs::ProbeContext};
use tracer_common::{counter, Event, LiveKey, Role, EVENT_FREE, STATE_UNREPORTED};

use crate::{
    args::arg,
    maps::{count, state, stopped, traced, wakeup_flags, EVENTS, LIVE},
    sampling::sampling,
};

/// Frees `addr` if it may be a recorded block, and tells user space.
/// Returns false when it was not recorded (sampling only: in exact mode
/// user space decides that).
#[inline(always)]
pub(crate) fn emit_free(pid: u32, tid: u32, addr: u64, role: Role) -> bool {
    if !sampling() {
        // Exact mode: LIVE holds only blocks whose ALLOC was dropped;
        // every other free goes to user space, which holds the live set
        // (frees of blocks from before the trace too: at most one per
        // such block). This saves a LIVE delete per free and an insert per
        // allocation, a third of exact mode's BPF time.
        if free_unreported(pid, addr) {
            return true;
        }
    } else if LIVE.remove(LiveKey::reported(pid, addr)).is_err() {
        // The delete alone decides whether this block was recorded
        // (another CPU may free the same address: only one delete
        // succeeds); no lookup first.
        return free_unreported(pid, addr);
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        count(counter::FREE_DROPPED);
        return true;
    };
    // No timestamp: user space does not read it for a FREE.
    entry.write(Event {
        kind: EVENT_FREE,
        pid,
        tid,
        stack_id: 0,
        addr,
        size: 0,
        timestamp_ns: 0,
        role: role as u32,
        flags: 0,
    });
    entry.submit(wakeup_flags());
    true
}

/// A block whose ALLOC event was dropped (user space never heard of it:
/// nothing to tell it). Looked for only once some block went unreported,
/// so that an unrecorded free costs one delete attempt, not two.
#[inline(always)]
fn free_unreported(pid: u32, addr: u64) -> bool {
    if state(STATE_UNREPORTED) == 0 || LIVE.remove(LiveKey::unreported(pid, addr)).is_err() {
        return false;
    }
    count(counter::FREE_OF_DROPPED_ALLOC);
    true
}

#[inline(always)]
pub(crate) fn on_free(ctx: &ProbeContext) -> u32 {
    let addr = arg(ctx, 0);
    // free(NULL) is a no-op.
    if addr == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if !traced(pid) {
        return 0;
    }
    if stopped() {
        return 0;
    }
    // When sampling, nearly every free is of a block that was not recorded:
    // one hash operation decides that, and nothing else is done. In exact
    // mode user space counts the unknown ones.
    if !emit_free(pid, pid_tgid as u32, addr, Role::Free) && !sampling() {
        count(counter::UNKNOWN_FREE);
    }
    0
}
