//! free(): when sampling, only blocks found in LIVE are reported, so a
//! free of an unrecorded block costs one hash operation. In exact mode
//! every block is reported, and so is every free of an address SEEN may
//! hold, without a LIVE operation: user space matches it to its block.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::map,
    maps::Array,
    programs::ProbeContext,
};
use tracer_common::{
    counter, Event, EventKind, LiveKey, Role, SEEN_PAGE, SEEN_PAGES, STATE_UNREPORTED,
};

use crate::{
    args::arg,
    maps::{count, count_by, state, stopped, traced, wakeup_flags, EVENTS, LIVE},
    sampling::sampling,
};

/// Exact mode: one byte per slot of addresses, set when a block at an
/// address of that slot is reported and never cleared. A free whose slot
/// is clear is of a block no process reported (allocated before the
/// trace, or in a process not traced then: a forked server's children
/// freeing what their parent allocated at its start): it is counted
/// here, and costs no ring-buffer event. A slot shared with a reported
/// address only costs the event. Keyed by the address alone: a child
/// freeing a block its traced parent reported is for user space to
/// judge. 8 MiB, allocated at load in exact mode (one page otherwise).
#[map]
pub(crate) static SEEN: Array<[u8; SEEN_PAGE]> = Array::with_max_entries(SEEN_PAGES, 0);

/// SEEN's page and byte for `addr` (allocators align blocks to 16 bytes
/// at least; a multiplicative hash spreads the rest).
#[inline(always)]
fn seen_slot(addr: u64) -> (u32, usize) {
    let h = (addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - 23);
    ((h >> 12) as u32, (h & (SEEN_PAGE as u64 - 1)) as usize)
}

/// Exact mode: a block at `addr` is about to be reported.
#[inline(always)]
pub(crate) fn mark_seen(addr: u64) {
    let (page, byte) = seen_slot(addr);
    if let Some(p) = SEEN.get_ptr_mut(page) {
        // SAFETY: an array map's value; a racing write stores 1 too.
        unsafe { (*p)[byte & (SEEN_PAGE - 1)] = 1 };
    }
}

/// Exact mode: whether a block at `addr` may have been reported.
#[inline(always)]
fn maybe_seen(addr: u64) -> bool {
    let (page, byte) = seen_slot(addr);
    SEEN.get(page)
        .is_none_or(|p| p[byte & (SEEN_PAGE - 1)] != 0)
}

/// What a free probe can tell of the size of a block it never saw
/// allocated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockSizes {
    Unknown,
    /// glibc: the 8 bytes before a block are its chunk's size field.
    GlibcChunks,
}

/// glibc's chunk-size field: the low 3 bits are flags, 0x2 marks a chunk
/// of its own mapping (whose header takes 16 bytes, not 8).
const CHUNK_FLAGS: u64 = 0x7;
const CHUNK_MMAPPED: u64 = 0x2;
/// A size field outside [32 B, 1 TiB) or not a multiple of 16 is not a
/// glibc chunk's (the process wrote over it, or it is not glibc's block):
/// not counted.
const CHUNK_MIN: u64 = 32;
const CHUNK_MAX: u64 = 1 << 40;

/// The usable size of the glibc block at `addr`, from its chunk header
/// (read from the process's memory: a value it controls, bounded here).
#[inline(always)]
fn glibc_block_size(addr: u64) -> Option<u64> {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    let field = unsafe { bpf_probe_read_user(addr.wrapping_sub(8) as *const u64) }.ok()?;
    let chunk = field & !CHUNK_FLAGS;
    if !(CHUNK_MIN..CHUNK_MAX).contains(&chunk) || !chunk.is_multiple_of(16) {
        return None;
    }
    let header = if field & CHUNK_MMAPPED != 0 { 16 } else { 8 };
    Some(chunk - header)
}

/// Frees `addr` if it may be a recorded block, and tells user space.
/// Returns false when it was not recorded (sampling: not in LIVE; exact
/// mode: SEEN says no block was reported there, counted as unknown; else
/// user space decides).
#[inline(always)]
pub(crate) fn emit_free(pid: u32, tid: u32, addr: u64, role: Role, sizes: BlockSizes) -> bool {
    if !sampling() {
        // Exact mode: LIVE holds only blocks whose ALLOC was dropped;
        // every other free goes to user space, which holds the live set
        // (frees of blocks from before the trace too: at most one per
        // such block). This saves a LIVE delete per free and an insert per
        // allocation, a third of exact mode's BPF time.
        if free_unreported(pid, addr) {
            return true;
        }
        if !maybe_seen(addr) {
            count(counter::UNKNOWN_FREE);
            if sizes == BlockSizes::GlibcChunks {
                if let Some(size) = glibc_block_size(addr) {
                    count_by(counter::UNKNOWN_FREE_BYTES, size);
                }
            }
            return false;
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
        kind: EventKind::Free as u32,
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
pub(crate) fn on_free(ctx: &ProbeContext, sizes: BlockSizes) -> u32 {
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
    // mode SEEN or user space tells the unknown ones.
    emit_free(pid, pid_tgid as u32, addr, Role::Free, sizes);
    0
}
