//! Each thread's allocator calls in flight, from entry to return.
//!
//! A hooked call made while another one of the same thread is in flight is
//! one of two things:
//! - called from inside it (glibc's realloc(NULL, n) calls malloc, the
//!   mmapped-chunk realloc calls malloc, reallocarray tail-calls realloc):
//!   only the outer call accounts, or the block would be counted twice and
//!   get the allocator's own stack;
//! - made by a signal handler that interrupted it: a call of its own, which
//!   must be recorded.
//!
//! The stack pointer alone cannot tell them apart (both are below the
//! outer call's entry SP), so the `signal_deliver` tracepoint marks the
//! thread's innermost call as interrupted. Below an interrupted call, a
//! call whose SP is at least `SIGFRAME_MIN` lower (the kernel's signal
//! frame lies between them), or higher (an alternate signal stack), is a
//! handler's: it gets a frame of its own on the thread's stack of calls
//! (`InFlightStack`), and its return is found by SP (entry SP + 8). Calls
//! of threads no signal reached cost what a single per-thread record did:
//! one hash lookup at entry and one at return, and the thread's map entry
//! is kept between calls (removed at thread exit) instead of inserted and
//! deleted per call.
//!
//! Why not key every call by (thread, entry SP), which records nested calls
//! without a tracepoint? The inner call of realloc(NULL, n) would then be
//! recorded with the allocator's stack, and the outer one skipped, which
//! changes every exact report's stacks; and each call would insert and
//! delete a map entry.
//!
//! Should an internal call be taken for a handler's (a signal delivered
//! during the outer call, and an allocator with a frame over SIGFRAME_MIN
//! bytes between them), the outer call is marked INFLIGHT_INNER_RECORDED
//! and does not record an address already in LIVE: never counted twice.

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use tracer_common::{
    counter, InFlight, InFlightStack, INFLIGHT_FRAMES, INFLIGHT_INNER_RECORDED,
    INFLIGHT_INTERRUPTED,
};

use crate::{
    maps::{count, no_return_needed, stopped, traced, INFLIGHT},
    sampling::sampling,
};

/// Least distance between the SP of an interrupted call and that of a call
/// made by the signal handler below it: the 128-byte red zone, the FPU
/// state (512 bytes at least) and `struct rt_sigframe` (over 400 bytes),
/// see arch/x86/kernel/signal.c get_sigframe(). Internal calls of an
/// allocator are a frame or two below the outer one.
const SIGFRAME_MIN: u64 = 1024;

const LAST: usize = INFLIGHT_FRAMES - 1;

/// The frame below the top of `len` frames in use (len >= 1), masked where
/// the verifier sees it. The compiler, knowing len in 1..=LAST, drops a
/// plain `& LAST` and indexes `frames + 24 * len - 24`, which verifiers
/// that learn nothing from `len != 0` (6.1) take for a negative offset;
/// read through `black_box`, the value is opaque to the compiler and the
/// mask stays.
#[inline(always)]
fn top_index(len: usize) -> usize {
    core::hint::black_box(len.wrapping_sub(1)) & LAST
}

/// This thread's stack of calls, created empty (zeroed) on its first call.
/// Only this thread's probes and its signal_deliver tracepoint touch it,
/// and they do not run concurrently.
#[inline(always)]
fn thread_calls() -> Option<&'static mut InFlightStack> {
    INFLIGHT.current(true)
}

/// Remembers a call entering at `call.entry_sp`. Returns what the entry
/// program returns: 1 in session mode skips the return run.
#[inline(always)]
pub(crate) fn enter(call: InFlight) -> u32 {
    let Some(calls) = thread_calls() else {
        count(counter::INFLIGHT_FULL);
        return no_return_needed();
    };
    let sp = call.entry_sp;
    for _ in 0..INFLIGHT_FRAMES {
        let len = calls.len as usize;
        if len == 0 {
            break;
        }
        let Some(top) = calls.frames.get_mut(top_index(len)) else {
            break;
        };
        let interrupted = top.flags & INFLIGHT_INTERRUPTED != 0;
        let handler = interrupted && (sp > top.entry_sp || sp + SIGFRAME_MIN < top.entry_sp);
        if handler {
            break;
        }
        if sp <= top.entry_sp {
            // Called from inside `top`, or tail-called by it (same SP).
            // In session mode its return run is skipped; otherwise the
            // depth tells its return probe to step aside.
            if no_return_needed() != 0 {
                return 1;
            }
            top.depth += 1;
            return 0;
        }
        // Entered above a call in flight: that call's return was never seen.
        calls.len -= 1;
        count(counter::STALE_INFLIGHT);
    }
    let len = calls.len as usize;
    if len > LAST {
        count(counter::NESTED_LOST);
        if let Some(top) = calls.frames.get_mut(LAST) {
            // Its return probe (without sessions) steps aside.
            top.depth += 1;
        }
        return no_return_needed();
    }
    if len > 0 && call.record != 0 {
        if let Some(outer) = calls.frames.get_mut(top_index(len)) {
            outer.flags |= INFLIGHT_INNER_RECORDED;
        }
    }
    if let Some(frame) = calls.frames.get_mut(len & LAST) {
        *frame = call;
        calls.len += 1;
    }
    0
}

/// Pops the call returning with stack pointer `sp`, or returns None for a
/// call inside it (only the outer one accounts) or a return without entry.
#[inline(always)]
pub(crate) fn take(sp: u64) -> Option<InFlight> {
    let Some(calls) = INFLIGHT.current(false).filter(|c| c.len > 0) else {
        // When sampling, most calls leave no record: not worth counting;
        // after the stop, no call does. Returns of processes that are not
        // traced (--binary, system-wide: the probes are on the file for
        // every process; without sessions every call's return runs) are
        // not counted either.
        if !sampling() && !stopped() && traced((bpf_get_current_pid_tgid() >> 32) as u32) {
            count(counter::RETURN_WITHOUT_ENTRY);
        }
        return None;
    };
    for _ in 0..INFLIGHT_FRAMES {
        let len = calls.len as usize;
        if len == 0 {
            break;
        }
        let at = top_index(len);
        let top = *calls.frames.get(at)?;
        // `ret` popped the return address: the call returns at entry SP + 8.
        let return_sp = top.entry_sp + 8;
        if sp > return_sp {
            if top.flags & INFLIGHT_INTERRUPTED != 0 && !returns_below(calls, at, sp) {
                // A handler's call on an alternate signal stack that left
                // no frame (not recorded, or NESTED_LOST).
                let top = calls.frames.get_mut(at)?;
                top.depth = top.depth.saturating_sub(1);
                return None;
            }
            // Returned past the innermost call: its return was never seen.
            calls.len -= 1;
            count(counter::STALE_INFLIGHT);
            continue;
        }
        if top.depth > 0 {
            calls.frames.get_mut(at)?.depth -= 1;
            return None;
        }
        if sp < return_sp {
            // A call inside `top` that left no record of its own.
            if !sampling() {
                count(counter::RETURN_WITHOUT_ENTRY);
            }
            return None;
        }
        calls.len -= 1;
        return Some(top);
    }
    None
}

/// Whether one of the `below` outer calls returns at `sp`: then the calls
/// above it were left (a handler that longjmp'ed out of them) and are stale.
#[inline(always)]
fn returns_below(calls: &InFlightStack, below: usize, sp: u64) -> bool {
    let mut i = 0;
    while i < LAST {
        if i < below && calls.frames.get(i).is_some_and(|f| f.entry_sp + 8 == sp) {
            return true;
        }
        i += 1;
    }
    false
}

/// signal_deliver: the thread is about to run a signal handler (or the
/// signal's default action); its innermost allocator call in flight, if
/// any, is interrupted, and the handler's calls get frames of their own.
#[inline(always)]
pub(crate) fn on_signal() {
    // The tracepoint runs in the thread that takes the signal, on its way
    // back to user mode: its own calls.
    let Some(calls) = INFLIGHT.current(false) else {
        return;
    };
    let len = calls.len as usize;
    if len == 0 {
        return;
    }
    if let Some(top) = calls.frames.get_mut(top_index(len)) {
        top.flags |= INFLIGHT_INTERRUPTED;
    }
}
