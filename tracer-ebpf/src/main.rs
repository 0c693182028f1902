//! memtrace-bpf's BPF programs: uprobes and uretprobes on the allocator.
//!
//! Each `#[uprobe]` / `#[uretprobe]` entry point is one line that calls a
//! shared helper. Entry probes remember {size, pointer argument, record?} per
//! thread in INFLIGHT; return probes read the result, capture the user stack,
//! insert the block into LIVE and emit an ALLOC event; free emits a FREE event
//! only for addresses found in LIVE, so frees of unrecorded blocks cost one
//! hash lookup.
// Built for real only for the BPF target; on the host (cargo clippy / test
// --workspace, where feature unification pulls in std through aya) it is an
// empty program, so the probe code is still type-checked and linted.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user,
    },
    macros::{map, raw_tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, ProbeContext, RawTracePointContext, RetProbeContext},
};
use tracer_common::{
    cookie, counter, Event, InFlight, LiveKey, LiveValue, Role, SampleHeader, StackSample,
    CONTROL_SESSION, CONTROL_STOPPED, EVENT_ALLOC, EVENT_ALLOC_SAMPLE, EVENT_EXEC, EVENT_EXIT,
    EVENT_FORK, EVENT_FREE, EXP_TABLE_LEN, EXP_TABLE_SHIFT, FILTER_ALL, FILTER_NONE, FILTER_PIDS,
    FORKS_COUNT, FORKS_FOLLOW, MAX_STACK_BYTES, STACK_CHUNK, UNWIND_DWARF, UNWIND_FP,
};

// Sizes here are defaults; user space sets the real ones with
// `EbpfLoader::set_max_entries` from --max-live, --stack-storage-size and
// --ringbuf-mb.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 << 20, 0);
#[map]
static LIVE: HashMap<LiveKey, LiveValue> = HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);
#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);
/// Keyed by pid_tgid. LRU so that threads that die inside malloc (or a return
/// probe lost at detach) cannot fill it.
#[map]
static INFLIGHT: LruHashMap<u64, InFlight> = LruHashMap::with_max_entries(16384, 0);
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
/// Index 0, bits set by user space: CONTROL_STOPPED when the trace ends
/// (from then on entry and free probes do nothing, so the report is the
/// heap as it was at that instant while the probes are being detached,
/// which takes seconds); CONTROL_SESSION when the allocating functions run
/// as uprobe session programs (through the dispatcher in uprobe_session.rs,
/// which tail-calls PROGS), where an entry program's non-zero return skips
/// the return run.
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

/// How stacks are captured: `UNWIND_FP` (kernel frame-pointer walk into
/// STACKS) or `UNWIND_DWARF` (registers + a copy of the stack, unwound in
/// user space). Read-only, set at load time.
#[unsafe(no_mangle)]
static UNWIND_MODE: u32 = UNWIND_FP;
/// Bytes of stack copied per sample in DWARF mode: a multiple of
/// STACK_CHUNK, at most MAX_STACK_BYTES (checked by user space).
#[unsafe(no_mangle)]
static STACK_BYTES: u32 = 8192;

/// Entry programs at their Role number, the return program at slot 15
/// (uprobe_session::RETURN_SLOT); filled by user space in session mode.
#[map]
static PROGS: ProgramArray = ProgramArray::with_max_entries(16, 0);

/// What an entry program returns for a call whose return it does not need:
/// in session mode, 1 skips the return run; otherwise the value is unused.
#[inline(always)]
fn no_return_needed() -> u32 {
    u32::from(control() & CONTROL_SESSION != 0)
}

/// See tracer_common::FILTER_*; set at load time.
#[unsafe(no_mangle)]
static FILTER: u32 = FILTER_NONE;
/// FILTER_ALL: only threads with this name (NUL-padded), if not empty.
#[unsafe(no_mangle)]
static COMM: [u8; 16] = [0; 16];
/// Tgids traced (FILTER_PIDS) or excluded (FILTER_ALL), kept by user space.
#[map]
static TRACED: HashMap<u32, u8> = HashMap::with_max_entries(8192, 0);

/// `--follow-forks` (FORKS_FOLLOW, with FILTER_PIDS): children of traced
/// processes join TRACED at fork. Otherwise (FORKS_COUNT) children of the
/// one traced process (FILTER_NONE) are only counted.
#[unsafe(no_mangle)]
static FOLLOW_FORKS: u32 = FORKS_COUNT;
/// Byte offset of `tgid` in the kernel's task_struct, from its BTF (Rust
/// BPF has no CO-RE relocations); 0 = unknown: forks are not looked at.
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;
/// 1 when sched_process_exit passes `group_dead` (Linux 6.16+).
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD: u32 = 0;

/// Whether calls of process `pid` are recorded.
#[inline(always)]
fn traced(pid: u32) -> bool {
    match tunable(&FILTER) {
        FILTER_PIDS => {
            // SAFETY: the value is not read.
            unsafe { TRACED.get(pid) }.is_some()
        }
        FILTER_ALL => {
            // SAFETY: as above.
            if unsafe { TRACED.get(pid) }.is_some() {
                return false;
            }
            // SAFETY: a plain read of a global, volatile as in `tunable`.
            let want = unsafe { core::ptr::read_volatile(&COMM) };
            want[0] == 0 || bpf_get_current_comm().is_ok_and(|comm| comm == want)
        }
        _ => true,
    }
}

/// Mean bytes between recorded allocations (`--sample-rate`); 1 records
/// every allocation (exact mode).
#[unsafe(no_mangle)]
static SAMPLE_RATE: u64 = 1;
/// See `tracer_common::EXP_TABLE_LEN`; filled in by the loader.
#[unsafe(no_mangle)]
static EXP_TABLE: [u32; EXP_TABLE_LEN] = [0; EXP_TABLE_LEN];

/// Bytes left until the next recorded allocation, per CPU (the jemalloc /
/// Go / heapprofd method, per CPU rather than per thread: an array lookup
/// instead of a hash lookup, and the Poisson process over bytes is the
/// same). Seeded by the loader with a random draw.
#[map]
static COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU buffer where a sample is assembled before it is copied into the
/// ring buffer with its real length (a reservation must have a fixed size).
#[map]
static SAMPLE_BUF: PerCpuArray<StackSample> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn tunable(value: &u32) -> u32 {
    // SAFETY: a plain read of a global; volatile so the compiler does not
    // fold in the default, since the loader rewrites it before loading.
    unsafe { core::ptr::read_volatile(value) }
}

#[inline(always)]
fn stopped() -> bool {
    control() & CONTROL_STOPPED != 0
}

#[inline(always)]
fn control() -> u32 {
    CONTROL.get(0).copied().unwrap_or(0)
}

/// Ask the kernel not to wake the reader on each event: a wakeup costs
/// 5–10 µs here (shared/TOOLCHAIN.md). User space polls every 10 ms, and is
/// woken early once WAKEUP_BYTES are pending, so a burst (DWARF samples are
/// kilobytes each) is drained before the buffer fills.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const WAKEUP_BYTES: u64 = 1 << 20;

#[inline(always)]
fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; BPF programs do not migrate CPUs mid-run and
        // uprobe programs do not nest on one CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// The arguments of an entry probe as they were at the function's entry.
/// A session probe placed past instructions that moved an argument (see
/// tracer_common::cookie) finds it where its attach cookie says; plain
/// uprobes have no cookie (0) and read the ABI registers.
struct Args<'a> {
    ctx: &'a ProbeContext,
    cookie: u64,
}

impl<'a> Args<'a> {
    #[inline(always)]
    fn of(ctx: &'a ProbeContext) -> Self {
        // SAFETY: the helper reads the attach cookie of the running probe.
        let cookie =
            unsafe { aya_ebpf::helpers::generated::bpf_get_attach_cookie(ctx.regs.cast()) };
        Args { ctx, cookie }
    }

    #[inline(always)]
    fn get(&self, n: usize) -> u64 {
        let at = (self.cookie >> (cookie::ARG_SHIFT as usize + 4 * n)) & 0xf;
        if at == 0 {
            return arg(self.ctx, n);
        }
        let regs = self.ctx.regs;
        // Each field is loaded at its constant offset: the verifier refuses
        // a load from the context at a computed one, which is what a match
        // over the fields compiles to.
        // SAFETY: the context is pt_regs, readable directly.
        let r = unsafe {
            use core::ptr::read_volatile as rd;
            [
                rd(&(*regs).rdi),
                rd(&(*regs).rsi),
                rd(&(*regs).rdx),
                rd(&(*regs).rcx),
                rd(&(*regs).r8),
                rd(&(*regs).r9),
                rd(&(*regs).rax),
                rd(&(*regs).r10),
                rd(&(*regs).r11),
            ]
        };
        match at {
            cookie::RDI => r[0],
            cookie::RSI => r[1],
            cookie::RDX => r[2],
            cookie::RCX => r[3],
            cookie::R8 => r[4],
            cookie::R9 => r[5],
            cookie::RAX => r[6],
            cookie::R10 => r[7],
            cookie::R11 => r[8],
            _ => 0,
        }
    }
}

#[inline(always)]
fn sampling() -> bool {
    // SAFETY: a plain read of a global, volatile as in `tunable`.
    unsafe { core::ptr::read_volatile(&SAMPLE_RATE) > 1 }
}

/// The "record this call or not" decision: every call in exact mode;
/// otherwise when the per-CPU byte countdown crosses zero, after which the
/// next countdown is drawn from an exponential distribution with mean R.
#[inline(always)]
fn should_record(size: u64) -> bool {
    // SAFETY: as in `sampling`.
    let rate = unsafe { core::ptr::read_volatile(&SAMPLE_RATE) };
    if rate <= 1 {
        return true;
    }
    let Some(left) = COUNTDOWN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot. A task preempted between these lines lets
    // another one on this CPU update it too: a skewed draw, not a fault.
    unsafe {
        *left -= size as i64;
        if *left > 0 {
            return false;
        }
        *left = next_interval(rate) as i64;
    }
    true
}

#[inline(always)]
fn next_interval(rate: u64) -> u64 {
    // SAFETY: helper without preconditions.
    let i = unsafe { aya_ebpf::helpers::generated::bpf_get_prandom_u32() } as usize % EXP_TABLE_LEN;
    // SAFETY: in-bounds read of a global, volatile as in `tunable`.
    let e = unsafe { core::ptr::read_volatile(&EXP_TABLE[i]) } as u64;
    ((e * rate) >> EXP_TABLE_SHIFT).max(1)
}

#[inline(always)]
fn stack_pointer(regs: *mut aya_ebpf::bindings::pt_regs) -> u64 {
    // SAFETY: `regs` is the program's context (pt_regs), which the verifier
    // lets programs of this type read directly.
    unsafe { (*regs).rsp }
}

#[inline(always)]
fn on_alloc_enter(ctx: &ProbeContext, role: Role, size: u64, ptr_arg: u64) -> u32 {
    on_alloc_enter_max(ctx, role, size, size, ptr_arg)
}

#[inline(always)]
fn on_alloc_enter_max(
    ctx: &ProbeContext,
    role: Role,
    size: u64,
    size_max: u64,
    ptr_arg: u64,
) -> u32 {
    if stopped() || !traced((bpf_get_current_pid_tgid() >> 32) as u32) {
        return no_return_needed();
    }
    let record = should_record(size);
    // An unrecorded call leaves no trace, unless it may free a recorded
    // block (realloc of a non-NULL pointer), which its return must see.
    // A return probe without a record then costs one hash lookup; nested
    // calls are still told apart by the stack pointer (take_inflight).
    let frees_old = resizes(role) && ptr_arg != 0;
    if !record && !frees_old {
        return no_return_needed();
    }
    let key = bpf_get_current_pid_tgid();
    let sp = stack_pointer(ctx.regs);
    if let Some(inflight) = INFLIGHT.get_ptr_mut(key) {
        // SAFETY: the entry belongs to this thread; only this thread's
        // probes touch it, and they do not run concurrently.
        let inflight = unsafe { &mut *inflight };
        // At or below the outer call's entry SP: called from inside it (or
        // tail-called by it, same SP). Only the outer call accounts. In
        // session mode its return run is skipped altogether; otherwise the
        // depth tells its return probe to step aside.
        if sp <= inflight.entry_sp {
            if no_return_needed() != 0 {
                return 1;
            }
            inflight.depth += 1;
            return 0;
        }
        count(counter::STALE_INFLIGHT);
    }
    let value = InFlight {
        size,
        ptr_arg,
        role: role as u32,
        depth: 0,
        record: record as u32,
        _pad: 0,
        size_max,
        entry_sp: sp,
    };
    if INFLIGHT.insert(key, value, 0).is_err() {
        count(counter::INFLIGHT_FULL);
    }
    0
}

/// Pops this thread's in-flight call, or returns None for a nested call
/// (only the outermost hooked function accounts) or a return without entry.
#[inline(always)]
fn take_inflight(ctx: &RetProbeContext) -> Option<InFlight> {
    let key = bpf_get_current_pid_tgid();
    let Some(ptr) = INFLIGHT.get_ptr_mut(key) else {
        // When sampling, most calls leave no record: not worth counting;
        // after the stop, no call does. Returns of processes that are not
        // traced (--binary, system-wide: the probes are on the file for
        // every process, and there the kernel runs the return even when a
        // session entry asked to skip it) are not counted either.
        if !sampling() && !stopped() && traced((key >> 32) as u32) {
            count(counter::RETURN_WITHOUT_ENTRY);
        }
        return None;
    };
    // SAFETY: this thread's own entry, see on_alloc_enter.
    let inflight = unsafe { &mut *ptr };
    // `ret` popped the return address: the outer call returns at entry SP + 8.
    let outer_return_sp = inflight.entry_sp + 8;
    let sp = stack_pointer(ctx.regs);
    if sp > outer_return_sp {
        // Returned past the recorded call: that record is stale.
        let _ = INFLIGHT.remove(key);
        count(counter::STALE_INFLIGHT);
        return None;
    }
    if inflight.depth > 0 {
        inflight.depth -= 1;
        return None;
    }
    if sp < outer_return_sp {
        // A nested call that left no record of its own.
        if !sampling() {
            count(counter::RETURN_WITHOUT_ENTRY);
        }
        return None;
    }
    let value = *inflight;
    let _ = INFLIGHT.remove(key);
    Some(value)
}

/// Functions that give up the block passed to them when they succeed.
#[inline(always)]
fn resizes(role: Role) -> bool {
    matches!(role, Role::Realloc | Role::ReallocArray | Role::Xallocx)
}

#[inline(always)]
fn emit_free(pid: u32, tid: u32, addr: u64, role: Role) {
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
fn record_alloc(ctx: &RetProbeContext, pid: u32, tid: u32, addr: u64, size: u64, role: Role) {
    if tunable(&UNWIND_MODE) == UNWIND_DWARF {
        record_alloc_sample(ctx, pid, tid, addr, size, role);
        return;
    }
    // Reserve first: if the event cannot be sent, the block must not enter
    // LIVE, or its later free would emit an orphan FREE.
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    let key = LiveKey { pid, _pad: 0, addr };
    if LIVE.insert(key, LiveValue { size }, 0).is_err() {
        count(counter::LIVE_MAP_FULL);
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
    entry.write(event(EVENT_ALLOC, pid, tid, stack_id, addr, size, role));
    entry.submit(wakeup_flags());
}

#[inline(always)]
fn event(kind: u32, pid: u32, tid: u32, stack_id: i32, addr: u64, size: u64, role: Role) -> Event {
    Event {
        kind,
        pid,
        tid,
        stack_id,
        addr,
        size,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        role: role as u32,
        _pad: 0,
    }
}

/// DWARF mode: the caller's registers and a copy of its stack, for user
/// space to unwind. At the return probe IP/SP/BP are the caller's state
/// right after the call.
#[inline(always)]
fn record_alloc_sample(
    ctx: &RetProbeContext,
    pid: u32,
    tid: u32,
    addr: u64,
    size: u64,
    role: Role,
) {
    let Some(buf) = SAMPLE_BUF.get_ptr_mut(0) else {
        count(counter::STACK_LOST);
        return;
    };
    // SAFETY: this CPU's slot; programs do not migrate or nest on a CPU.
    let sample = unsafe { &mut *buf };
    // SAFETY: the context is pt_regs, readable directly.
    let (ip, sp, bp) = unsafe { ((*ctx.regs).rip, (*ctx.regs).rsp, (*ctx.regs).rbp) };
    let len = copy_stack(sp, &mut sample.stack);
    if len == 0 {
        count(counter::STACK_LOST);
    }
    sample.header = SampleHeader {
        event: event(EVENT_ALLOC_SAMPLE, pid, tid, 0, addr, size, role),
        ip,
        sp,
        bp,
        stack_len: len as u32,
        _pad: 0,
    };
    let key = LiveKey { pid, _pad: 0, addr };
    if LIVE.insert(key, LiveValue { size }, 0).is_err() {
        count(counter::LIVE_MAP_FULL);
        return;
    }
    let total = core::mem::size_of::<SampleHeader>() + len;
    // SAFETY: `total` is at most the size of `sample` (len <= MAX_STACK_BYTES).
    let bytes = unsafe { core::slice::from_raw_parts(buf as *const u8, total) };
    if EVENTS.output::<[u8]>(bytes, wakeup_flags()).is_err() {
        // Not sent: forget the block, or its free would emit an orphan FREE.
        let _ = LIVE.remove(key);
        count(counter::RINGBUF_FULL);
    }
}

/// Copies up to STACK_BYTES of user stack from `sp` upwards and returns how
/// many bytes were copied. A read crossing the top of the stack fails whole
/// (and zero-fills), so the stack is read in chunks and the chunk that
/// fails is retried up to its page boundary (shared/TOOLCHAIN.md).
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

/// Return of every allocating function. `ret` is the returned pointer, or
/// for posix_memalign the int result (0 = success, pointer in *memptr).
#[inline(always)]
fn on_alloc_return(ctx: &RetProbeContext) -> u32 {
    let Some(call) = take_inflight(ctx) else {
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let ret: u64 = ctx.ret();
    let Some(role) = Role::from_u32(call.role) else {
        return 0;
    };
    let addr = match role {
        Role::PosixMemalign => {
            if ret as u32 != 0 {
                return 0; // failed: *memptr is untouched
            }
            // SAFETY: reading user memory through the helper, which faults
            // safely and returns an error instead.
            match unsafe { bpf_probe_read_user(call.ptr_arg as *const u64) } {
                Ok(addr) => addr,
                Err(_) => {
                    count(counter::READ_FAILED);
                    return 0;
                }
            }
        }
        _ => ret,
    };
    if role == Role::Xallocx {
        // In place: `ret` is the usable size, at least `size` on success,
        // the old (smaller) usable size on failure. The block keeps its
        // address and now has the size asked for, up to size + extra.
        if ret < call.size || call.ptr_arg == 0 {
            return 0;
        }
        emit_free(pid, tid, call.ptr_arg, role);
        if call.record != 0 {
            let size = if ret < call.size_max {
                ret
            } else {
                call.size_max
            };
            record_alloc(ctx, pid, tid, call.ptr_arg, size, role);
        }
        return 0;
    }
    if matches!(role, Role::Realloc | Role::ReallocArray) && call.ptr_arg != 0 {
        // realloc frees the old block when it returns a new one, and
        // realloc(p, 0) frees p and returns NULL. A failed realloc (NULL for
        // a non-zero size) leaves the old block alive.
        if addr != 0 || call.size == 0 {
            emit_free(pid, tid, call.ptr_arg, role);
        }
    }
    if addr == 0 || call.record == 0 {
        return 0;
    }
    record_alloc(ctx, pid, tid, addr, call.size, role);
    0
}

#[inline(always)]
fn on_free(ctx: &ProbeContext) -> u32 {
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

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Malloc, a.get(0), 0)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    // An overflowing nmemb * size makes calloc fail; the return sees NULL.
    on_alloc_enter(&ctx, Role::Calloc, a.get(0).wrapping_mul(a.get(1)), 0)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Realloc, a.get(1), a.get(0))
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(
        &ctx,
        Role::ReallocArray,
        a.get(1).wrapping_mul(a.get(2)),
        a.get(0),
    )
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::PosixMemalign, a.get(2), a.get(0))
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::AlignedAlloc, a.get(1), 0)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Memalign, a.get(1), 0)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Valloc, a.get(0), 0)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Pvalloc, a.get(0), 0)
}

#[uprobe]
pub fn xallocx_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    let (ptr, size, extra) = (a.get(0), a.get(1), a.get(2));
    on_alloc_enter_max(&ctx, Role::Xallocx, size, size.saturating_add(extra), ptr)
}

/// sched_process_exec: a traced process (or, under --binary, any process,
/// which may now run the binary) replaced its image. Its old heap is gone,
/// and user space must read its new mappings and maybe hook new objects.
/// Sent from the exec'ing task before the new image runs, so it precedes
/// that image's events in the ring buffer.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let wanted = match tunable(&FILTER) {
        // SAFETY: the value is not read. User space puts the one traced
        // process into TRACED for this check.
        FILTER_NONE => unsafe { TRACED.get(pid) }.is_some(),
        // --binary: any process may now run the binary.
        FILTER_PIDS if tunable(&FOLLOW_FORKS) != FORKS_FOLLOW => true,
        _ => traced(pid),
    };
    if tunable(&FILTER) == FILTER_PIDS && tunable(&FOLLOW_FORKS) != FORKS_FOLLOW {
        // --binary: the new image is traced only if it is the binary, and
        // then binary_entry adds the process back at its entry point. (A
        // child joins at fork, and most children exec something else.)
        let _ = TRACED.remove(pid);
    }
    if !wanted || stopped() {
        return 0;
    }
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return 0;
    };
    // The new image's name, for a process that exits before user space
    // can read its command line (see tracer_common::EVENT_EXEC).
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let mut name = [0u64; 2];
    for (i, word) in name.iter_mut().enumerate() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&comm[8 * i..8 * i + 8]);
        *word = u64::from_le_bytes(bytes);
    }
    entry.write(event(
        EVENT_EXEC,
        pid,
        pid_tgid as u32,
        0,
        name[0],
        name[1],
        Role::Malloc,
    ));
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

/// sched_process_fork, run by the parent before the child first runs (args:
/// parent and child task_struct). A new process (not a thread) forked by a
/// traced one joins the traced set here under --follow-forks, and under
/// --binary (it runs the binary too, until it execs something else), so
/// none of its allocations is missed; under --pid or a command without
/// --follow-forks, it is counted as not traced.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn process_fork(ctx: RawTracePointContext) -> i32 {
    on_fork(ctx.arg::<u64>(1));
    0
}

#[inline(always)]
fn on_fork(child_task: u64) {
    let offset = tunable(&TASK_TGID_OFFSET);
    let follow = tunable(&FOLLOW_FORKS) == FORKS_FOLLOW;
    let filter = tunable(&FILTER);
    // FILTER_PIDS is --binary or --follow-forks; under FILTER_ALL
    // (system-wide) every process is traced already.
    let counting = filter == FILTER_NONE && !follow;
    let following = filter == FILTER_PIDS;
    if offset == 0 || stopped() || !(counting || following) {
        return;
    }
    let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: the value is not read.
    if unsafe { TRACED.get(parent) }.is_none() {
        return;
    }
    // SAFETY: the helper reads kernel memory and fails safely; the address
    // is the child's task_struct plus the field offset from the kernel BTF.
    let Ok(child) = (unsafe { bpf_probe_read_kernel((child_task + offset as u64) as *const u32) })
    else {
        count(counter::CHILD_NOT_FOLLOWED);
        return;
    };
    // A new thread of the same process.
    if child == parent {
        return;
    }
    if counting {
        count(counter::CHILD_NOT_TRACED);
        return;
    }
    if TRACED.insert(child, 1, 0).is_err() {
        count(counter::CHILD_NOT_FOLLOWED);
        return;
    }
    emit_process_event(EVENT_FORK, child, parent);
}

/// sched_process_exit, run by each exiting thread (args: task, and on
/// 6.16+ `group_dead`). When the last thread of a traced process exits,
/// user space hears of it and deletes the process's LIVE entries, so the
/// map holds only blocks of processes that still run. Under
/// --follow-forks the process also leaves the traced set, so that a new
/// process reusing its pid is not traced.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    let group_dead = if tunable(&EXIT_GROUP_DEAD) != 0 {
        ctx.arg::<u64>(1) & 0xff != 0
    } else {
        // Older kernels: the main thread's exit stands for the process's.
        let pid_tgid = bpf_get_current_pid_tgid();
        pid_tgid >> 32 == pid_tgid & 0xffff_ffff
    };
    if !group_dead {
        return 0;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let wanted = if tunable(&FOLLOW_FORKS) == FORKS_FOLLOW {
        TRACED.remove(pid).is_ok()
    } else {
        match tunable(&FILTER) {
            // SAFETY: the value is not read (user space keeps the one
            // traced process in TRACED, see process_exec).
            FILTER_NONE => unsafe { TRACED.get(pid) }.is_some(),
            // --binary: a process that exec'ed away keeps its old image's
            // LIVE entries until it exits, so every exit is reported; user
            // space ignores the pids it knows nothing of.
            FILTER_PIDS => true,
            _ => traced(pid),
        }
    };
    if wanted && !stopped() {
        emit_process_event(EVENT_EXIT, pid, 0);
    }
    0
}

#[inline(always)]
fn emit_process_event(kind: u32, pid: u32, tid: u32) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    entry.write(event(kind, pid, tid, 0, 0, 0, Role::Malloc));
    entry.submit(BPF_RB_FORCE_WAKEUP);
}

/// One return program serves every allocating function: the role comes from
/// the in-flight entry.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    on_alloc_return(&ctx)
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    on_free(&ctx)
}

/// `--binary`: on the program's entry point (before main, after the dynamic
/// loader), the process joins the traced set here, in the kernel, so none
/// of its allocations from then on is missed, however soon it makes them.
/// User space learns of it from the exec event.
#[uprobe]
pub fn binary_entry(_ctx: ProbeContext) -> u32 {
    if tunable(&FILTER) == FILTER_PIDS && !stopped() {
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // A full map: user space, adding the pid at the exec event, finds
        // it full too and reports the process as not traced.
        let _ = TRACED.insert(pid, 1, 0);
    }
    0
}

/// Benchmark floors (`--noop-probes`): probes that do nothing, to measure
/// what the kernel charges for the probes alone.
#[uprobe]
pub fn noop_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
