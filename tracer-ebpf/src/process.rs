//! Process lifecycle: exec, fork, exit and signal tracepoints, and the
//! `--binary` entry-point probe that adds a process to the traced set.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{raw_tracepoint, uprobe},
    programs::{ProbeContext, RawTracePointContext},
};
use tracer_common::{
    counter, Event, EventKind, Role, FILTER_ALL, FILTER_CGROUP, FILTER_NONE, FILTER_PIDS,
    FORKS_FOLLOW,
};

use crate::maps::{
    count, event, stopped, traced, tunable, BPF_RB_FORCE_WAKEUP, EVENTS, EXIT_GROUP_DEAD, INFLIGHT,
    TASK_START_OFFSET, TASK_TGID_OFFSET, TRACED,
};
use crate::{
    code_gen, inflight,
    settings::{filter, follow_forks},
};

/// sched_process_exec: a traced process (or, under --binary, any process,
/// which may now run the binary) replaced its image. Its old heap is gone,
/// and user space must read its new mappings and maybe hook new objects.
/// Sent from the exec'ing task before the new image runs, so it precedes
/// that image's events in the ring buffer.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    code_gen::forget(pid);
    let wanted = match filter() {
        // SAFETY: the value is not read. User space puts the one traced
        // process into TRACED for this check.
        FILTER_NONE => unsafe { TRACED.get(pid) }.is_some(),
        // --binary: any process may now run the binary.
        FILTER_PIDS if follow_forks() != FORKS_FOLLOW => true,
        _ => traced(pid),
    };
    if filter() == FILTER_PIDS && follow_forks() != FORKS_FOLLOW {
        // --binary: the new image is traced only if it is the binary, and
        // then binary_entry adds the process back at its entry point. (A
        // child joins at fork, and most children exec something else.)
        let _ = TRACED.remove(pid);
    }
    if !wanted || stopped() {
        return 0;
    }
    // The new image's executable mappings count from here, before user
    // space reads its maps: a library loaded and replaced before that
    // read is known to have been.
    code_gen::track_from_exec(pid);
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return 0;
    };
    // The new image's name, for a process that exits before user space
    // can read its command line (see tracer_common::EventKind::Exec).
    let comm = bpf_get_current_comm().unwrap_or([0; 16]);
    let mut name = [0u64; 2];
    for (i, word) in name.iter_mut().enumerate() {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&comm[8 * i..8 * i + 8]);
        *word = u64::from_le_bytes(bytes);
    }
    // Args: the task, the thread id it had before exec, the binprm. After
    // exec it runs as the main thread: bpf_get_current_pid_tgid() gives
    // the pid twice.
    let old_tid = ctx.arg::<u64>(1) as u32;
    let mut exec = event(
        EventKind::Exec,
        pid,
        old_tid,
        0,
        name[0],
        name[1],
        Role::Malloc,
    );
    exec.timestamp_ns = task_start(ctx.arg::<u64>(0));
    entry.write(exec);
    entry.submit(BPF_RB_FORCE_WAKEUP);
    0
}

/// When `task` started (`start_boottime`, ns since boot); 0 when the
/// kernel's BTF did not say where that is or the read failed.
#[inline(always)]
fn task_start(task: u64) -> u64 {
    let offset = tunable(&TASK_START_OFFSET);
    if offset == 0 || task == 0 {
        return 0;
    }
    // SAFETY: the helper reads kernel memory and fails safely; the address
    // is the tracepoint's task plus the BTF offset of a u64 field.
    unsafe { bpf_probe_read_kernel((task + u64::from(offset)) as *const u64) }.unwrap_or(0)
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
    let follow = follow_forks() == FORKS_FOLLOW;
    let filter = filter();
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
    emit_process_event(EventKind::Fork, child, parent);
}

/// sched_process_exit, run by each exiting thread (args: task, and on
/// 6.16+ `group_dead`). When the last thread of a traced process exits,
/// user space hears of it and deletes the process's LIVE entries, so the
/// map holds only blocks of processes that still run. Under
/// --follow-forks the process also leaves the traced set, so that a new
/// process reusing its pid is not traced.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    INFLIGHT.forget_current();
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
    code_gen::forget(pid);
    let wanted = if follow_forks() == FORKS_FOLLOW {
        TRACED.remove(pid).is_ok()
    } else {
        match filter() {
            // SAFETY: the value is not read (user space keeps the one
            // traced process in TRACED, see process_exec).
            FILTER_NONE => unsafe { TRACED.get(pid) }.is_some(),
            // --binary: a process that exec'ed away keeps its old image's
            // LIVE entries until it exits, so every exit is reported; user
            // space ignores the pids it knows nothing of. --cgroup: the
            // same for a process moved out of the cgroup before it exits.
            FILTER_PIDS | FILTER_CGROUP => true,
            _ => traced(pid),
        }
    };
    if wanted && !stopped() {
        emit_process_event(EventKind::Exit, pid, 0);
    }
    0
}

/// oom:mark_victim (args: the victim's task_struct, and its uid), run
/// by whichever task ran into the limit, once per victim, after SIGKILL
/// was queued to it. A raw tracepoint: attached by name, no tracefs
/// needed. The victim's tgid is read from its task_struct at the offset
/// the kernel's BTF gave (as at fork); without it nothing is sent.
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn oom_mark_victim(ctx: RawTracePointContext) -> i32 {
    on_oom_victim(ctx.arg::<u64>(0));
    0
}

#[inline(always)]
fn on_oom_victim(task: u64) {
    let offset = tunable(&TASK_TGID_OFFSET);
    if offset == 0 || stopped() {
        return;
    }
    // SAFETY: the helper reads kernel memory and fails safely; the address
    // is the victim's task_struct plus the field offset from the kernel
    // BTF.
    let Ok(tgid) = (unsafe { bpf_probe_read_kernel((task + offset as u64) as *const u32) }) else {
        return;
    };
    // Under FILTER_NONE user space keeps the one traced process in
    // TRACED; under FILTER_ALL and FILTER_CGROUP TRACED holds the excluded
    // tgids, and the thread-name and cgroup filters cannot be checked here (the current task is not
    // the victim): user space ignores victims it has no allocation from.
    // SAFETY: the value is not read.
    let in_map = unsafe { TRACED.get(tgid) }.is_some();
    let wanted = match filter() {
        FILTER_ALL | FILTER_CGROUP => !in_map,
        _ => in_map,
    };
    if wanted {
        emit_process_event(EventKind::OomKill, tgid, 0);
    }
}

#[inline(always)]
fn emit_process_event(kind: EventKind, pid: u32, tid: u32) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    entry.write(event(kind, pid, tid, 0, 0, 0, Role::Malloc));
    entry.submit(BPF_RB_FORCE_WAKEUP);
}

/// `--binary`: on the program's entry point (before main, after the dynamic
/// loader), the process joins the traced set here, in the kernel, so none
/// of its allocations from then on is missed, however soon it makes them.
/// User space learns of it from the exec event.
#[uprobe]
pub fn binary_entry(_ctx: ProbeContext) -> u32 {
    if filter() == FILTER_PIDS && !stopped() {
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // A full map: user space, adding the pid at the exec event, finds
        // it full too and reports the process as not traced.
        let _ = TRACED.insert(pid, 1, 0);
    }
    0
}

/// signal_deliver, run by a thread about to take a signal: an allocator
/// call it is in is interrupted, and calls the handler makes are its own
/// (see inflight.rs). One task-storage lookup per signal delivered.
#[raw_tracepoint(tracepoint = "signal_deliver")]
pub fn signal_deliver(_ctx: RawTracePointContext) -> i32 {
    inflight::on_signal();
    0
}
