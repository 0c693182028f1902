//! Recording an allocation with its call stack: a kernel frame-pointer
//! walk into STACKS (`UNWIND_FP`), registers and a copy of the stack for
//! user space to unwind (`UNWIND_DWARF`), or the return addresses walked
//! in the kernel from unwind tables (`UNWIND_TABLES`, `walk.rs`).

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    programs::{tracing::StackIdContext, RetProbeContext},
};
use tracer_common::{
    counter, Event, EventKind, FramesHeader, LiveKey, LiveValue, Role, SampleHeader, FRAMES_ENDED,
    FRAMES_RESUME, MAX_FRAMES, MAX_STACK_BYTES, STACK_CHUNK, STATE_UNREPORTED, UNWIND_DWARF,
    UNWIND_TABLES,
};

use crate::{
    code_gen::code_gen,
    free::mark_seen,
    maps::{
        count, event, tunable, wakeup_flags, EVENTS, LIVE, STACKS, STACK_BYTES, STATE, UNWIND_MODE,
    },
    sampling::sampling,
    scratch::{Scratch, SAMPLE_BUF},
    walk::{owns_slot, walk, FRAMES_BUF},
};

#[inline(always)]
pub(crate) fn record_alloc(
    ctx: &RetProbeContext,
    pid: u32,
    tid: u32,
    addr: u64,
    size: u64,
    role: Role,
    flags: u32,
) {
    let mut ev = event(EventKind::Alloc, pid, tid, 0, addr, size, role);
    ev.flags = flags;
    match tunable(&UNWIND_MODE) {
        UNWIND_DWARF => return record_alloc_sample(ctx, ev),
        UNWIND_TABLES => return record_alloc_frames(ctx, ev),
        _ => {}
    }
    // Reserve first: if the event cannot be sent, the block enters LIVE
    // marked unreported, so that its free is told from an unknown one and
    // sends no orphan FREE.
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        insert_unreported(pid, addr, size);
        return;
    };
    if !track(pid, addr, size) {
        entry.discard(0);
        return;
    }
    // At the return probe the registers are the caller's: a frame-pointer
    // walk from here starts at the allocating call site.
    let stack_id = match ctx.get_stackid(&STACKS, BPF_F_USER_STACK as u64) {
        Ok(id) => id as i32,
        Err(err) => {
            count(counter::STACK_LOST);
            if err < 0 {
                err
            } else {
                -1
            }
        }
    };
    ev.stack_id = stack_id;
    entry.write(ev);
    entry.submit(wakeup_flags());
}

/// DWARF mode: the caller's registers and a copy of its stack, for user
/// space to unwind. At the return probe IP/SP/BP are the caller's state
/// right after the call.
#[inline(always)]
fn record_alloc_sample(ctx: &RetProbeContext, mut ev: Event) {
    ev.kind = EventKind::AllocSample as u32;
    // Held to the end of this function (its Drop gives the slot back).
    let scratch = Scratch::take();
    let buf = match &scratch {
        Some(s) => SAMPLE_BUF.get_ptr_mut(s.slot),
        None => None,
    };
    let Some(buf) = buf else {
        count(counter::STACK_LOST);
        if track(ev.pid, ev.addr, ev.size) {
            output_or_unreported(&bare_sample(ev), &ev);
        }
        return;
    };
    // SAFETY: this CPU's slot; programs do not migrate or nest on a CPU.
    let sample = unsafe { &mut *buf };
    // SAFETY: the context is pt_regs, readable directly.
    let (ip, sp, bp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    let header = SampleHeader {
        event: ev,
        ip,
        sp,
        bp,
        stack_len: 0,
        maps_gen: code_gen(ev.pid).0,
    };
    // The header first: a program of another thread that runs in this
    // slot meanwhile (see maps::SCRATCH_SLOTS) writes its own first too,
    // so a copy whose header is no longer this one is made again.
    let mut len = 0;
    let mut attempt = 0;
    while attempt < 2 {
        sample.header = header;
        len = copy_stack(sp, &mut sample.stack);
        sample.header.stack_len = len as u32;
        if same_event(&sample.header.event, &ev) {
            break;
        }
        attempt += 1;
    }
    if len == 0 {
        count(counter::STACK_LOST);
    }
    if !track(ev.pid, ev.addr, ev.size) {
        return;
    }
    if !same_event(&sample.header.event, &ev) {
        // Taken over: the allocation goes without its stack.
        count(counter::STACK_LOST);
        output_or_unreported(&bare_sample(ev), &ev);
        return;
    }
    let Some(total) = output_len(
        core::mem::size_of::<SampleHeader>() + len,
        core::mem::size_of::<tracer_common::StackSample>(),
    ) else {
        return; // cannot happen: len <= MAX_STACK_BYTES
    };
    // SAFETY: `total` is at most the size of `sample` (checked above).
    let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, total) };
    if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_err() {
        // Not sent: the block stays, marked unreported, so that its free
        // sends no orphan FREE and is told from an unknown one.
        count(counter::RINGBUF_FULL);
        insert_unreported(ev.pid, ev.addr, ev.size);
    }
}

/// Puts a block about to be reported into LIVE, where free() will look
/// for it; false (counted) when LIVE is full. In exact mode every block is
/// reported and free() reports every free, so LIVE is left alone: user
/// space, which holds the live set, matches frees to blocks, bounds that
/// set by --max-live and counts what it has no block for.
#[inline(always)]
fn track(pid: u32, addr: u64, size: u64) -> bool {
    if !sampling() {
        mark_seen(addr);
        return true;
    }
    if LIVE
        .insert(LiveKey::reported(pid, addr), live(size, 0), 0)
        .is_err()
    {
        count(counter::LIVE_MAP_FULL);
        return false;
    }
    true
}

#[inline(always)]
fn live(size: u64, unreported: u32) -> LiveValue {
    LiveValue {
        size,
        unreported,
        _pad: 0,
    }
}

/// A block whose ALLOC event was dropped (see `LiveKey::tag`). Where a
/// reported entry was inserted first, it goes: the block is in LIVE once.
#[inline(always)]
fn insert_unreported(pid: u32, addr: u64, size: u64) {
    let _ = LIVE.remove(LiveKey::reported(pid, addr));
    if let Some(flag) = STATE.get_ptr_mut(STATE_UNREPORTED) {
        // SAFETY: a u64 slot of an array map; a racing write stores 1 too.
        unsafe { *flag = 1 };
    }
    if LIVE
        .insert(LiveKey::unreported(pid, addr), live(size, 1), 0)
        .is_err()
    {
        count(counter::LIVE_MAP_FULL);
    }
}

/// Tables mode: the return addresses walked in the kernel (`walk.rs`); when
/// the walk met an address user space has not described yet, also the
/// registers there and a copy of the stack from there.
#[inline(always)]
fn record_alloc_frames(ctx: &RetProbeContext, mut ev: Event) {
    // SAFETY: the context is pt_regs, readable directly.
    let (ip, sp, bp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    ev.kind = EventKind::AllocFrames as u32;
    // Held to the end of this function (its Drop gives the slot back).
    let scratch = Scratch::take();
    let slot = scratch.as_ref().map_or(0, |s| s.slot);
    let found = match scratch {
        Some(_) => (walk(slot, ev.pid, ip, sp, bp), FRAMES_BUF.get_ptr_mut(slot)),
        None => (None, None),
    };
    let (Some(w), Some(buf)) = found else {
        // Every slot held by programs this one preempted or interrupted.
        count(counter::STACK_LOST);
        if track(ev.pid, ev.addr, ev.size) {
            output_or_unreported(&bare_frames(ev), &ev);
        }
        return;
    };
    // SAFETY: this CPU's slot; programs do not migrate or nest on a CPU.
    let sample = unsafe { &mut *buf };
    let depth = (w.depth as usize).min(MAX_FRAMES);
    let mut stack_len = 0;
    let mut total = core::mem::size_of::<FramesHeader>() + 8 * depth;
    if w.flags & FRAMES_RESUME != 0 {
        stack_len = copy_stack(w.sp, &mut sample.stack);
        total = core::mem::size_of::<FramesHeader>() + 8 * MAX_FRAMES + stack_len;
    }
    sample.header = FramesHeader {
        event: ev,
        depth: depth as u32,
        flags: w.flags,
        ip: w.ip,
        sp: w.sp,
        bp: if w.bp_known != 0 { w.bp } else { 0 },
        stack_len: stack_len as u32,
        maps_gen: w.maps_gen,
    };
    let Some(total) = output_len(total, core::mem::size_of::<tracer_common::FramesSample>()) else {
        return; // cannot happen: depth <= MAX_FRAMES, stack_len <= MAX_STACK_BYTES
    };
    if !track(ev.pid, ev.addr, ev.size) {
        return;
    }
    if !owns_slot(slot, w.owner) || !same_event(&sample.header.event, &ev) {
        // Another thread's walk took this slot meanwhile (scratch.rs):
        // the allocation goes without its stack.
        count(counter::STACK_LOST);
        output_or_unreported(&bare_frames(ev), &ev);
        return;
    }
    // SAFETY: `total` is at most the size of `sample` (checked above).
    let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, total) };
    if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_err() {
        // Not sent: the block stays, marked unreported (as in record_alloc).
        count(counter::RINGBUF_FULL);
        insert_unreported(ev.pid, ev.addr, ev.size);
    }
}

/// An allocation without its stack, tables mode.
#[inline(always)]
fn bare_frames(event: Event) -> FramesHeader {
    FramesHeader {
        event,
        depth: 0,
        flags: FRAMES_ENDED,
        ip: 0,
        sp: 0,
        bp: 0,
        stack_len: 0,
        maps_gen: 0,
    }
}

/// An allocation without its stack, DWARF mode.
#[inline(always)]
fn bare_sample(event: Event) -> SampleHeader {
    SampleHeader {
        event,
        ip: 0,
        sp: 0,
        bp: 0,
        stack_len: 0,
        maps_gen: 0,
    }
}

/// Whether the event in a scratch buffer is still `ev` (no other thread's
/// program wrote its own there meanwhile).
#[inline(always)]
fn same_event(found: &Event, ev: &Event) -> bool {
    found.tid == ev.tid && found.addr == ev.addr && found.timestamp_ns == ev.timestamp_ns
}

/// Sends `header` alone (an allocation without its stack), or marks the
/// block unreported when the ring buffer is full.
#[inline(always)]
fn output_or_unreported<T>(header: &T, ev: &Event) {
    if EVENTS.output::<T>(header, wakeup_flags()).is_err() {
        count(counter::RINGBUF_FULL);
        insert_unreported(ev.pid, ev.addr, ev.size);
    }
}

/// `len` if it is at most `max`, checked where the verifier sees it: the
/// compiler, knowing the bound, would drop the check and hand
/// bpf_ringbuf_output a length whose lower bound older verifiers (6.1)
/// cannot tell is not negative; through `black_box` the value is opaque
/// to the compiler and the unsigned compare stays.
#[inline(always)]
fn output_len(len: usize, max: usize) -> Option<usize> {
    let len = core::hint::black_box(len);
    (len <= max).then_some(len)
}

/// Copies up to STACK_BYTES of user stack from `sp` upwards and returns how
/// many bytes were copied. A read crossing the top of the stack fails whole
/// (and zero-fills), so the stack is read in chunks and the chunk that
/// fails is retried up to its page boundary.
#[inline(always)]
fn copy_stack(sp: u64, dst: &mut [u8; MAX_STACK_BYTES]) -> usize {
    let want = tunable(&STACK_BYTES) as usize;
    let mut len = 0;
    let mut i = 0;
    while i < MAX_STACK_BYTES / STACK_CHUNK {
        let off = i * STACK_CHUNK;
        if off >= want {
            break;
        }
        let src = sp + off as u64;
        let chunk = dst[off..].as_mut_ptr();
        if read_user(chunk, STACK_CHUNK as u32, src) {
            len = off + STACK_CHUNK;
            i += 1;
            continue;
        }
        let to_page = (STACK_CHUNK as u64 - (src & (STACK_CHUNK as u64 - 1))) as u32
            & (STACK_CHUNK as u32 - 1);
        if to_page != 0 && read_user(chunk, to_page, src) {
            len = off + to_page as usize;
        }
        break;
    }
    len
}

#[inline(always)]
fn read_user(dst: *mut u8, size: u32, src: u64) -> bool {
    // SAFETY: the helper checks the user address and faults safely; `dst`
    // has at least `size` bytes left (callers pass a chunk inside the buffer).
    unsafe {
        aya_ebpf::helpers::generated::bpf_probe_read_user(
            dst.cast(),
            size,
            src as *const core::ffi::c_void,
        ) == 0
    }
}
