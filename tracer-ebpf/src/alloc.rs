//! Allocation entry and return: the entry remembers the call on its
//! thread's stack of calls in flight (`inflight`), the one return program
//! reads the result and frees what a resizing call gave up, then hands
//! recorded blocks to `stack`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    counter, InFlight, LiveKey, Role, EVENT_UNLESS_LIVE, INFLIGHT_INNER_RECORDED, STATE_UNREPORTED,
};

use crate::{
    free::{emit_free, BlockSizes},
    inflight,
    maps::{count, is_target, no_return_needed, state, stopped, traced, LIVE},
    sampling::{sampling, should_record},
    stack::record_alloc,
};

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
    // calls are still told apart by the stack pointer (inflight::take).
    let frees_old = resizes(role) && ptr_arg != 0;
    if !record && !frees_old {
        return no_return_needed();
    }
    inflight::enter(InFlight {
        size,
        ptr_arg,
        role: role as u32,
        depth: 0,
        record: record as u32,
        flags: 0,
        size_max,
        entry_sp: stack_pointer(ctx.regs),
    })
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
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if no_return_needed() != 0 {
        // Session mode: only calls whose entry asked for it get here.
        count(if is_target(pid) {
            counter::RETURN_RUNS
        } else {
            counter::RETURN_RUNS_UNTRACED
        });
    }
    let Some(call) = inflight::take(stack_pointer(ctx.regs)) else {
        return 0;
    };
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
        emit_free(pid, tid, call.ptr_arg, role, BlockSizes::Unknown);
        if call.record != 0 {
            let size = if ret < call.size_max {
                ret
            } else {
                call.size_max
            };
            record_alloc(ctx, pid, tid, call.ptr_arg, size, role, 0);
        }
        return 0;
    }
    if matches!(role, Role::Realloc | Role::ReallocArray) && call.ptr_arg != 0 {
        // realloc frees the old block when it returns a new one, and
        // realloc(p, 0) frees p and returns NULL. A failed realloc (NULL for
        // a non-zero size) leaves the old block alive.
        if addr != 0 || call.size == 0 {
            emit_free(pid, tid, call.ptr_arg, role, BlockSizes::Unknown);
        }
    }
    if addr == 0 || call.record == 0 {
        return 0;
    }
    let mut flags = 0;
    if call.flags & INFLIGHT_INNER_RECORDED != 0 {
        // A call inside this one, taken for a signal handler's, may have
        // recorded this very block (see inflight.rs): count it once.
        if is_live(pid, addr) {
            return 0;
        }
        // In exact mode LIVE holds only unreported blocks: user space,
        // which holds the reported ones, skips the event if the address is
        // live there.
        if !sampling() {
            flags = EVENT_UNLESS_LIVE;
        }
    }
    record_alloc(ctx, pid, tid, addr, call.size, role, flags);
    0
}

#[inline(always)]
fn is_live(pid: u32, addr: u64) -> bool {
    // SAFETY: the values are not read.
    unsafe {
        (sampling() && LIVE.get(LiveKey::reported(pid, addr)).is_some())
            || (state(STATE_UNREPORTED) != 0 && LIVE.get(LiveKey::unreported(pid, addr)).is_some())
    }
}
