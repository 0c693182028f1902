//! Tables mode (`UNWIND_TABLES`): the kernel walks the user stack from the
//! unwind rows user space loaded (docs/unwind-tables.md) and the event
//! carries return addresses only.
//!
//! One frame per call of a global function (`memtrace_walk_step`), which
//! the verifier checks once on its own, whatever the depth and whatever
//! the caller. A frame: find the mapping of (tgid, pc) in
//! UNWIND_MAPPINGS (longest prefix match), binary-search its file's rows in
//! UNWIND_ROWS for the last row at or below the pc, apply the row (CFA,
//! return address at CFA - 8, caller's RBP); where no row covers the pc,
//! take a frame-pointer step. An address in no mapping user space
//! described stops the walk with FRAMES_RESUME: the registers there and a
//! copy of the stack go to user space, which unwinds the rest as in DWARF
//! mode and describes the process's new mappings for the next walks.

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{lpm_trie::Key, Array, LpmTrie, PerCpuArray},
};
use tracer_common::{
    counter,
    unwind_row::{
        self, FP_AT_CFA, FP_LOST, KIND_DEREF_FP, KIND_DEREF_SP, KIND_FP, KIND_NO_INFO,
        KIND_OUTERMOST, KIND_PLT, KIND_SIGNAL, KIND_SP,
    },
    FramesSample, MappingKey, MappingValue, FRAMES_ENDED, FRAMES_RESUME, FRAMES_TRUNCATED,
    MAPPING_KEY_BITS, MAPPING_TABLE, MAX_FRAMES, STATE_UNWIND_GEN,
};

use crate::{
    code_gen::code_gen,
    maps::{count, state as state_slot},
    scratch::SCRATCH_SLOTS,
    window::{empty_window, read, read_pair},
};

/// Every loaded file's rows, each file in its own extent (user space
/// allocates them; sizes set at load time from --unwind-rows). Mmapable:
/// user space writes a table with memcpy, not a syscall per row.
#[map]
pub(crate) static UNWIND_ROWS: Array<u64> = Array::with_max_entries(1 << 21, BPF_F_MMAPABLE);
/// (tgid, address) → table and load address of each executable mapping.
#[map]
pub(crate) static UNWIND_MAPPINGS: LpmTrie<MappingKey, MappingValue> =
    LpmTrie::with_max_entries(1 << 16, 0);
/// Per CPU, the rule last found for each of RULE_CACHE_ENTRIES (tgid,
/// pc) slots (direct-mapped), so that a call site walked again costs one
/// array read instead of a trie lookup and a binary search (together about
/// 0.13 µs a frame here). An entry counts only under the generation it was
/// filled in: user space bumps STATE_UNWIND_GEN after every change to
/// UNWIND_MAPPINGS, so no entry outlives the mapping it came from. Rows of
/// a table never change while a mapping refers to them, and an entry keeps
/// the rule word itself, not its row. 32 KiB per CPU, allocated at load.
#[map]
pub(crate) static RULE_CACHE: PerCpuArray<RuleCacheEntry> =
    PerCpuArray::with_max_entries(RULE_CACHE_ENTRIES, 0);
const RULE_CACHE_ENTRIES: u32 = 1024;

/// What a walk does at one pc: apply a row's rule, or take a
/// frame-pointer step (no row, or a mapping without a table).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct RuleCacheEntry {
    pc: u64,
    gen: u64,
    pid: u32,
    /// CACHED_ROW (then `rule` is the row's rule word) or CACHED_FP_STEP.
    what: u32,
    rule: u32,
    _pad: u32,
}
const CACHED_ROW: u32 = 1;
const CACHED_FP_STEP: u32 = 2;

/// Per-CPU buffer where an EventKind::AllocFrames is assembled.
#[map]
pub(crate) static FRAMES_BUF: PerCpuArray<FramesSample> =
    PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Steps of the binary search: log2 of the largest table (4 Mi rows) + 1.
const SEARCH_STEPS: u32 = 23;
/// A frame pointer farther than this above SP is not one (the default
/// stack limit is 8 MiB).
const MAX_FP_DISTANCE: u64 = 8 << 20;

/// The walk's state, kept per CPU in WALK_STATE for the step function.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Walk {
    pub(crate) ip: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    pub(crate) pid: u32,
    pub(crate) depth: u32,
    /// FRAMES_* bits.
    pub(crate) flags: u32,
    pub(crate) bp_known: u32,
    /// The frame came from a signal frame: `ip` is where the code was
    /// interrupted, not a return address.
    pub(crate) signal: u32,
    /// The scratch slot the walk runs in (scratch.rs).
    pub(crate) slot: u32,
    /// The process's code generation when the walk started (code_gen.rs).
    pub(crate) maps_gen: u32,
    pub(crate) _pad: u32,
    /// STATE_UNWIND_GEN when the walk started (0: the rule cache is off).
    pub(crate) gen: u64,
    /// The walking thread's pid_tgid: another thread whose program ran
    /// on this CPU while this one was preempted, in the same scratch slot,
    /// leaves its own here.
    pub(crate) owner: u64,
}

/// Per CPU, the walk in progress. The step function is a global BPF
/// function, which the verifier checks once on its own with no knowledge
/// of its caller: it takes no arguments and finds the walk here.
#[map]
static WALK_STATE: PerCpuArray<Walk> = PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Walks a stack tried at most this many times: a walk whose scratch slot
/// another thread's walk took meanwhile (see maps::SCRATCH_SLOTS) is
/// walked again from the start.
const WALK_ATTEMPTS: u32 = 3;

/// Walks from the caller's registers; the addresses land in
/// `FRAMES_BUF.frames`. Returns the state at the end, or None when this
/// CPU's state slot cannot be had (counted as a lost stack).
#[inline(always)]
pub(crate) fn walk(slot: u32, pid: u32, ip: u64, sp: u64, bp: u64) -> Option<Walk> {
    let owner = bpf_get_current_pid_tgid();
    let state = WALK_STATE.get_ptr_mut(slot)?;
    let (maps_gen, stale) = code_gen(pid);
    let start = Walk {
        ip,
        sp,
        bp,
        pid,
        depth: 0,
        flags: 0,
        bp_known: 1,
        signal: 0,
        slot,
        maps_gen,
        _pad: 0,
        gen: state_slot(STATE_UNWIND_GEN),
        owner,
    };
    if stale {
        // Code was mapped since user space read the maps: the tables it
        // described may be of a file unmapped since. The stack goes from
        // the leaf, for user space to unwind with the maps as they are.
        // The state holds this walk, as after steps: owns_slot checks it.
        count(counter::UNWIND_RESUMED);
        let resume = Walk {
            flags: FRAMES_RESUME,
            ..start
        };
        // SAFETY: this CPU's slot (see maps::SCRATCH_SLOTS).
        unsafe { *state = resume };
        return Some(resume);
    }
    let mut attempt = 0;
    while attempt < WALK_ATTEMPTS {
        // SAFETY: this CPU's slot (see maps::SCRATCH_SLOTS).
        unsafe { *state = start };
        empty_window(slot);
        steps(slot);
        // SAFETY: as above.
        let w = unsafe { *state };
        if w.owner == owner {
            return Some(w);
        }
        attempt += 1;
    }
    // Taken over at every attempt: the allocation is still recorded, as
    // one whose stack was lost.
    count(counter::STACK_LOST);
    Some(Walk {
        flags: FRAMES_ENDED,
        ..start
    })
}

/// Runs the walk in this thread's WALK_STATE slot to its end. A bounded
/// loop of calls: the verifier follows the loop (a few instructions per
/// round) and checks the step's body only once, so its work does not grow
/// with the depth or swing with how a release explores loop bodies; no
/// bpf_loop needed either. The step ends the walk by itself at MAX_FRAMES
/// (FRAMES_TRUNCATED).
#[inline(always)]
fn steps(slot: u32) {
    let mut i = 0;
    while i <= MAX_FRAMES {
        if memtrace_walk_step(u64::from(slot)) == 0 {
            break;
        }
        i += 1;
    }
}

/// Whether scratch slot `slot` still holds the walk of `owner`.
#[inline(always)]
pub(crate) fn owns_slot(slot: u32, owner: u64) -> bool {
    // SAFETY: this CPU's slot, read once.
    WALK_STATE
        .get_ptr_mut(slot)
        .is_some_and(|s| unsafe { (*s).owner } == owner)
}

/// One frame of the walk in WALK_STATE slot `slot`: 1 to go on, 0 when
/// it is over. A global function (exported, not inlined): verified once,
/// apart from every caller, as a function of one scalar returning a scalar.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn memtrace_walk_step(slot: u64) -> i64 {
    let slot = (slot as u32) & (SCRATCH_SLOTS - 1);
    let Some(state) = WALK_STATE.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: this CPU's slot (scratch.rs).
    let w = unsafe { &mut *state };
    w.slot = slot;
    i64::from(step_frame(w, slot))
}

/// One frame; false when the walk is over.
#[inline(always)]
fn step_frame(w: &mut Walk, slot: u32) -> bool {
    let Some(buf) = FRAMES_BUF.get_ptr_mut(slot) else {
        w.flags |= FRAMES_ENDED;
        return false;
    };
    let depth = w.depth as usize;
    if depth >= MAX_FRAMES {
        w.flags |= FRAMES_TRUNCATED;
        count(counter::UNWIND_TRUNCATED);
        return false;
    }
    let pc = if w.signal != 0 { w.ip } else { w.ip - 1 };
    let Some((what, rule)) = rule_at(w, pc) else {
        w.flags |= FRAMES_RESUME;
        count(counter::UNWIND_RESUMED);
        return false;
    };
    // SAFETY: this CPU's buffer; programs do not migrate or nest on a CPU.
    unsafe { (*buf).frames[depth & (MAX_FRAMES - 1)] = w.ip };
    w.depth += 1;
    if what == CACHED_ROW {
        apply(w, rule, pc)
    } else {
        fp_step(w)
    }
}

/// What to do at `pc`: from the rule cache, or found in the mappings and
/// rows (and cached); None for an address in no mapping described.
#[inline(always)]
fn rule_at(w: &Walk, pc: u64) -> Option<(u32, u32)> {
    let slot = RULE_CACHE.get_ptr_mut(cache_slot(w.pid, pc));
    // SAFETY: this CPU's slot; programs do not migrate or nest on a CPU.
    let cached = slot
        .map(|e| unsafe { *e })
        .filter(|e| w.gen != 0 && e.gen == w.gen && e.pc == pc && e.pid == w.pid && e.what != 0);
    if let Some(e) = cached {
        return Some((e.what, e.rule));
    }
    let key = Key::new(MAPPING_KEY_BITS, MappingKey::new(w.pid, pc));
    let mapping = *UNWIND_MAPPINGS.get(&key)?;
    let row = if mapping.kind == MAPPING_TABLE {
        find_row(&mapping, pc)
    } else {
        None
    };
    let (what, rule) = match row {
        Some(rule) => (CACHED_ROW, rule),
        None => (CACHED_FP_STEP, 0),
    };
    if let Some(e) = slot {
        // SAFETY: as above.
        unsafe {
            *e = RuleCacheEntry {
                pc,
                gen: w.gen,
                pid: w.pid,
                what,
                rule,
                _pad: 0,
            }
        };
    }
    Some((what, rule))
}

/// RULE_CACHE slot of (tgid, pc): call sites are a few bytes to a few
/// KiB apart, so the low bits of pc spread them; the tgid keeps two
/// processes running one program at different slots.
#[inline(always)]
fn cache_slot(pid: u32, pc: u64) -> u32 {
    ((pc ^ (pc >> 10) ^ (pid as u64).wrapping_mul(0x9e37)) as u32) & (RULE_CACHE_ENTRIES - 1)
}

/// The rule word of the last row at or below `pc`, if a row covers it.
#[inline(always)]
fn find_row(m: &MappingValue, pc: u64) -> Option<u32> {
    let rel = pc.checked_sub(m.load_base)?;
    if rel >> 32 != 0 {
        return None;
    }
    let rel = rel as u32;
    // `lo` ends as the number of rows at or below `rel`.
    let (mut lo, mut hi) = (0u32, m.rows);
    let mut i = 0;
    while i < SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        let row = *UNWIND_ROWS.get(m.first_row.wrapping_add(mid))?;
        if unwind_row::row_pc(row) <= rel {
            lo = mid + 1;
        } else {
            hi = mid;
        }
        i += 1;
    }
    let row = *UNWIND_ROWS.get(m.first_row.wrapping_add(lo.checked_sub(1)?))?;
    Some(unwind_row::row_rule(row))
}

/// Ends the walk before the root, counted under `why`.
#[inline(always)]
fn end(w: &mut Walk, why: u32) -> bool {
    w.flags |= FRAMES_ENDED;
    count(why);
    false
}

/// Applies one row's rule at `pc` (docs/unwind-tables.md, "What a row says").
#[inline(always)]
fn apply(w: &mut Walk, rule: u32, pc: u64) -> bool {
    let cfa_off = unwind_row::cfa_offset(rule) as u64;
    let fp_off = unwind_row::fp_offset(rule) as u64;
    let cfa = match unwind_row::kind(rule) {
        KIND_SP => w.sp.wrapping_add(cfa_off),
        KIND_FP if w.bp_known != 0 => w.bp.wrapping_add(cfa_off),
        KIND_DEREF_SP => match read(w.slot, w.sp.wrapping_add(cfa_off)) {
            Some(v) => v,
            None => return end(w, counter::UNWIND_READ_FAILED),
        },
        KIND_DEREF_FP if w.bp_known != 0 => match read(w.slot, w.bp.wrapping_add(cfa_off)) {
            Some(v) => v,
            None => return end(w, counter::UNWIND_READ_FAILED),
        },
        KIND_FP | KIND_DEREF_FP => return end(w, counter::UNWIND_BAD_FRAME),
        KIND_PLT => {
            let past_push = (pc & 15) as u32 >= unwind_row::plt_threshold(rule);
            w.sp + 8 + if past_push { 8 } else { 0 }
        }
        KIND_SIGNAL => return signal_frame(w),
        KIND_OUTERMOST => return false,
        KIND_NO_INFO => return fp_step(w),
        _ => return end(w, counter::UNWIND_UNSUPPORTED),
    };
    if cfa <= w.sp {
        return end(w, counter::UNWIND_BAD_FRAME);
    }
    let fp_rule = unwind_row::fp_rule(rule);
    // RBP saved right below the return address (`push rbp` first, the
    // usual case): one read of both words instead of two reads.
    let (ra, saved_bp) = if fp_rule == FP_AT_CFA && fp_off == (-16i64) as u64 {
        match read_pair(w.slot, cfa - 16) {
            Some([bp, ra]) => (ra, Some(bp)),
            None => return end(w, counter::UNWIND_READ_FAILED),
        }
    } else {
        match read(w.slot, cfa - 8) {
            Some(ra) => (ra, None),
            None => return end(w, counter::UNWIND_READ_FAILED),
        }
    };
    match fp_rule {
        FP_AT_CFA => match saved_bp.or_else(|| read(w.slot, cfa.wrapping_add(fp_off))) {
            Some(bp) => {
                w.bp = bp;
                w.bp_known = 1;
            }
            None => return end(w, counter::UNWIND_READ_FAILED),
        },
        FP_LOST => w.bp_known = 0,
        _ => {}
    }
    w.sp = cfa;
    w.ip = ra;
    w.signal = 0;
    ra != 0
}

/// `__restore_rt`: the interrupted code's RIP, RSP and RBP are in the
/// `ucontext_t` at RSP (uc_mcontext.gregs at +40: RBP, RSP, RIP).
#[inline(always)]
fn signal_frame(w: &mut Walk) -> bool {
    // Lowest address first: one window read then holds all three.
    let (Some(bp), Some(sp), Some(ip)) = (
        read(w.slot, w.sp + 120),
        read(w.slot, w.sp + 160),
        read(w.slot, w.sp + 168),
    ) else {
        return end(w, counter::UNWIND_READ_FAILED);
    };
    w.ip = ip;
    w.sp = sp;
    w.bp = bp;
    w.bp_known = 1;
    w.signal = 1;
    ip != 0
}

/// No row for this address: follow the frame-pointer chain one frame
/// (hand-written assembly, JIT code, files without CFI).
#[inline(always)]
fn fp_step(w: &mut Walk) -> bool {
    let bp = w.bp;
    if w.bp_known == 0 || bp < w.sp || bp - w.sp > MAX_FP_DISTANCE || bp & 7 != 0 {
        return end(w, counter::UNWIND_BAD_FRAME);
    }
    let Some([caller_bp, ra]) = read_pair(w.slot, bp) else {
        return end(w, counter::UNWIND_READ_FAILED);
    };
    count(counter::UNWIND_FP_STEPS);
    w.sp = bp + 16;
    w.bp = caller_bp;
    w.ip = ra;
    w.signal = 0;
    ra != 0
}
