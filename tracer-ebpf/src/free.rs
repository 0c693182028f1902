//! free(): only blocks found in LIVE are reported, so a free of an
//! unrecorded block costs one hash lookup.

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, programs::ProbeContext};
use tracer_common::{counter, Event, LiveKey, Role, EVENT_FREE};

use crate::{
    alloc::arg,
    maps::{count, event, stopped, traced, wakeup_flags, EVENTS, LIVE},
    sampling::sampling,
};

#[inline(always)]
pub(crate) fn emit_free(pid: u32, tid: u32, addr: u64, role: Role) {
    let key = LiveKey { pid, _pad: 0, addr };
    // The delete decides whether this block was recorded.
    if LIVE.remove(key).is_err() {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    entry.write(event(EVENT_FREE, pid, tid, 0, addr, 0, role));
    entry.submit(wakeup_flags());
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
    // When sampling, nearly every free is of a block that was not recorded:
    // one hash lookup decides that, and nothing else is done.
    // SAFETY: the value is not read.
    if unsafe { LIVE.get(LiveKey { pid, _pad: 0, addr }) }.is_none() {
        if !sampling() && !stopped() {
            count(counter::UNKNOWN_FREE);
        }
        return 0;
    }
    if !stopped() {
        emit_free(pid, pid_tgid as u32, addr, Role::Free);
    }
    0
}
