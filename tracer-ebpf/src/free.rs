//! free(): only blocks found in LIVE are reported, so a free of an
//! unrecorded block costs one hash lookup.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, programs::ProbeContext};
use tracer_common::{counter, Event, LiveKey, Role, EVENT_FREE};

use crate::{
    args::arg,
    maps::{count, event, stopped, traced, wakeup_flags, EVENTS, LIVE},
    sampling::sampling,
};

/// Frees `addr` if it is a recorded block, and tells user space. Returns
/// false when it was not in LIVE.
#[inline(always)]
pub(crate) fn emit_free(pid: u32, tid: u32, addr: u64, role: Role) -> bool {
    let key = LiveKey { pid, _pad: 0, addr };
    // SAFETY: a copy of the value is taken at once.
    let Some(value) = (unsafe { LIVE.get(key) }).copied() else {
        return false;
    };
    // The delete decides whether this block was recorded (another CPU may
    // free the same address: only one delete succeeds).
    if LIVE.remove(key).is_err() {
        return true;
    }
    if value.unreported != 0 {
        // User space never heard of this block: nothing to tell it.
        count(counter::FREE_OF_DROPPED_ALLOC);
        return true;
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        count(counter::FREE_DROPPED);
        return true;
    };
    entry.write(event(EVENT_FREE, pid, tid, 0, addr, 0, role));
    entry.submit(wakeup_flags());
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
    // one hash lookup decides that, and nothing else is done.
    if !emit_free(pid, pid_tgid as u32, addr, Role::Free) && !sampling() {
        count(counter::UNKNOWN_FREE);
    }
    0
}
