//! The walker's window on the user stack: per CPU, the stretch of stack
//! the current walk read last, and the reads that go through it.

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated::bpf_probe_read_user as bpf_probe_read_user_raw},
    macros::map,
    maps::PerCpuArray,
};

use crate::scratch::SCRATCH_SLOTS;

/// Bytes of user stack one read brings into the walk's window.
const WINDOW_BYTES: usize = 2048;
const WINDOW_WORDS: usize = WINDOW_BYTES / 8;

/// Per CPU, the stretch of user stack the current walk read last. A
/// bpf_probe_read_user costs about 0.1 µs here, nearly all of it fixed
/// (the fault-proof copy's set-up and the kernel's usercopy checks), and
/// most frames are far smaller than the window: a walk reads one window
/// for several frames instead of one read each. Emptied at the start of
/// every walk, so nothing of one process's stack serves another's.
#[repr(C)]
pub(crate) struct StackWindow {
    /// User address of `words[0]`.
    base: u64,
    /// Bytes of `words` that hold the stack at `base` (0: empty).
    len: u64,
    words: [u64; WINDOW_WORDS],
}
#[map]
static WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Empties `slot`'s window: a new walk reads nothing of an earlier one.
#[inline(always)]
pub(crate) fn empty_window(slot: u32) {
    if let Some(win) = WINDOW.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot (see maps::SCRATCH_SLOTS).
        unsafe { (*win).len = 0 };
    }
}

/// The word at user address `addr`.
#[inline(always)]
pub(crate) fn read(slot: u32, addr: u64) -> Option<u64> {
    read_words(slot, addr, false).map(|[w, _]| w)
}

/// The two words at user address `addr` (one read for both).
#[inline(always)]
pub(crate) fn read_pair(slot: u32, addr: u64) -> Option<[u64; 2]> {
    read_words(slot, addr, true)
}

/// The word at `addr`, and the next one if `pair` (else the second word is
/// meaningless): from the walk's window, refilled at `addr` when it does
/// not hold them. Where a whole window cannot be read (the top of a
/// mapping, an unaligned address), only what was asked for is read.
#[inline(always)]
fn read_words(slot: u32, addr: u64, pair: bool) -> Option<[u64; 2]> {
    let Some(win) = WINDOW.get_ptr_mut(slot) else {
        return read_direct(addr, pair);
    };
    // SAFETY: this CPU's slot; programs do not migrate or nest on a CPU.
    let win = unsafe { &mut *win };
    let off = addr.wrapping_sub(win.base);
    if addr.is_multiple_of(8) && win.len >= 16 && off <= win.len - 16 {
        return Some(window_pair(win, off));
    }
    if !addr.is_multiple_of(8) {
        return read_direct(addr, pair);
    }
    // SAFETY: `words` is WINDOW_BYTES long; the helper checks the user
    // address and fails (zero-filling) instead of faulting.
    let ret = unsafe {
        bpf_probe_read_user_raw(
            win.words.as_mut_ptr().cast(),
            WINDOW_BYTES as u32,
            addr as *const core::ffi::c_void,
        )
    };
    if ret != 0 {
        win.len = 0;
        return read_direct(addr, pair);
    }
    win.base = addr;
    win.len = WINDOW_BYTES as u64;
    Some(window_pair(win, 0))
}

#[inline(always)]
fn window_pair(win: &StackWindow, off: u64) -> [u64; 2] {
    let i = (off / 8) as usize;
    [
        win.words[i & (WINDOW_WORDS - 1)],
        win.words[(i + 1) & (WINDOW_WORDS - 1)],
    ]
}

#[inline(always)]
fn read_direct(addr: u64, pair: bool) -> Option<[u64; 2]> {
    if pair {
        // SAFETY: the helper checks the user address and fails instead of
        // faulting.
        unsafe { bpf_probe_read_user(addr as *const [u64; 2]) }.ok()
    } else {
        // SAFETY: as above.
        unsafe { bpf_probe_read_user(addr as *const u64) }
            .ok()
            .map(|w| [w, 0])
    }
}
