//! Allocation entry and return: the entry remembers the call per thread in
//! INFLIGHT, the one return program reads the result and frees what a
//! resizing call gave up, then hands recorded blocks to `stack`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{cookie, counter, InFlight, Role};

use crate::{
    free::emit_free,
    maps::{count, no_return_needed, stopped, traced, INFLIGHT},
    sampling::{sampling, should_record},
    stack::record_alloc,
};

#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// The arguments of an entry probe as they were at the function's entry.
/// A session probe placed past instructions that moved an argument (see
/// tracer_common::cookie) finds it where its attach cookie says; plain
/// uprobes have no cookie (0) and read the ABI registers.
pub(crate) struct Args<'a> {
    ctx: &'a ProbeContext,
    cookie: u64,
}

impl<'a> Args<'a> {
    #[inline(always)]
    pub(crate) fn of(ctx: &'a ProbeContext) -> Self {
        // SAFETY: the helper reads the attach cookie of the running probe.
        let cookie =
            unsafe { aya_ebpf::helpers::generated::bpf_get_attach_cookie(ctx.regs.cast()) };
        Args { ctx, cookie }
    }

    #[inline(always)]
    pub(crate) fn get(&self, n: usize) -> u64 {
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
fn stack_pointer(regs: *mut aya_ebpf::bindings::pt_regs) -> u64 {
    // SAFETY: `regs` is the program's context (pt_regs), which the verifier
    // lets programs of this type read directly.
    unsafe { (*regs).rsp }
}

#[inline(always)]
pub(crate) fn on_alloc_enter(ctx: &ProbeContext, role: Role, size: u64, ptr_arg: u64) -> u32 {
    on_alloc_enter_max(ctx, role, size, size, ptr_arg)
}

#[inline(always)]
pub(crate) fn on_alloc_enter_max(
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

/// Return of every allocating function. `ret` is the returned pointer, or
/// for posix_memalign the int result (0 = success, pointer in *memptr).
#[inline(always)]
pub(crate) fn on_alloc_return(ctx: &RetProbeContext) -> u32 {
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
