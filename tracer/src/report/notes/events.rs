//! The words of the notes about processes, events and losses: exited
//! processes, unknown frees, a full ring buffer, cut stacks.

use std::fmt;

use super::super::{counted, human_bytes, plural, Note};

/// Processes that exited during the trace, other than the one whose exit
/// ended it, and what they left unfreed.
pub(super) fn processes_exited(
    f: &mut fmt::Formatter<'_>,
    processes: u64,
    unfreed: u64,
    bytes: u64,
    objects: u64,
) -> fmt::Result {
    write!(
        f,
        "{} exited during the trace; ",
        counted(processes, "process", "processes")
    )?;
    match unfreed {
        0 => f.write_str("none left blocks unfreed"),
        n => write!(
            f,
            "{n} of them left {} in {} unfreed, shown under \"not freed at exit\" (not in-use: \
             no live process holds it)",
            counted(bytes, "byte", "bytes"),
            counted(objects, "object", "objects"),
        ),
    }
}

/// What the frees of blocks the trace never saw allocated are. Measured
/// with glibc 2.36 (a 64-thread program: 2 per thread; ripgrep: all but a
/// few): tcache_thread_shutdown() at each thread's exit frees the thread's
/// cache, which _int_malloc allocated without going through malloc, and
/// every block still in it, which the program had freed already.
pub(super) fn unknown_frees(
    f: &mut fmt::Formatter<'_>,
    (n, bytes): (u64, u64),
    traced_from_start: bool,
    live_map_full: bool,
) -> fmt::Result {
    let before = if traced_from_start {
        ""
    } else {
        "blocks allocated before the trace started, "
    };
    let untracked = if live_map_full {
        ", blocks not tracked because the live map was full"
    } else {
        ""
    };
    write!(
        f,
        "{} of blocks the trace never saw allocated {} ignored (not a loss): {before}the \
         allocator's own memory (with glibc, each exiting thread hands back its cache of freed \
         blocks: the cache, allocated inside malloc, and the blocks in it, which the program \
         had freed already){untracked}",
        counted(n, "free", "frees"),
        plural(n, "was", "were")
    )?;
    if bytes > 0 {
        write!(
            f,
            "; they handed back {} (glibc's chunk sizes)",
            human_bytes(bytes)
        )?;
        if !traced_from_start {
            f.write_str(
                ", which the in-use bytes above do not subtract: with --interval, a stack whose \
                 rise these frees match while the heap as a whole stays flat is classed \
                 replacing (a full cache replacing entries from before the trace), not growing",
            )?;
        }
    }
    Ok(())
}

/// What a full ring buffer did to the numbers (raise --ringbuf-mb).
pub(super) fn ringbuf_full(
    f: &mut fmt::Formatter<'_>,
    dropped: u64,
    frees_dropped: u64,
    frees_of_dropped_allocs: u64,
) -> fmt::Result {
    let frees = frees_dropped.min(dropped);
    let others = dropped - frees;
    write!(
        f,
        "the ring buffer was full (raise --ringbuf-mb): {} dropped. In-use may be overstated: \
         {} among them, whose blocks still count as in use. The other {} (allocations, \
         process events) are missing from the report; {} of blocks whose allocation event was \
         dropped {} counted apart from frees of blocks allocated before the trace",
        counted(dropped, "event was", "events were"),
        counted(frees, "free was", "frees were"),
        others,
        counted(frees_of_dropped_allocs, "free", "frees"),
        plural(frees_of_dropped_allocs, "was", "were")
    )
}

/// Why the kernel's walks ended early, the reasons that occurred only, and
/// what to do where something can be done.
pub(super) fn kernel_walks_cut(f: &mut fmt::Formatter<'_>, note: &Note) -> fmt::Result {
    let Note::KernelWalksCut {
        stacks,
        at_limit,
        unsupported,
        read_failed,
        bad_frame,
        copy_cut,
        stack_bytes,
        max_frames,
    } = *note
    else {
        return Ok(());
    };
    let limit = format!("deeper than the walker's limit of {max_frames} frames");
    let reasons: Vec<String> = [
        (at_limit, limit.as_str()),
        (unsupported, "at unwind rules the walker cannot follow"),
        (read_failed, "at stack memory that could not be read"),
        (
            bad_frame,
            "at a frame without unwind information or frame pointer",
        ),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, why)| format!("{n} {why}"))
    .collect();
    let mut why = match reasons.is_empty() {
        true => String::new(),
        false => format!(" (kernel walks ended: {})", reasons.join(", ")),
    };
    if copy_cut > 0 {
        let max = tracer_common::MAX_STACK_BYTES;
        let remedy = match (stack_bytes as usize) < max {
            true => format!("raise --stack-bytes, up to {max}, for these"),
            false => format!("{max} bytes is the most --stack-bytes allows"),
        };
        why = format!(
            "{why}; {} at code mapped after the process's maps were read (a library \
             loaded with dlopen, new JIT code) {} finished from a copy of {stack_bytes} stack \
             bytes that did not reach the root ({remedy}); the walks after such code is \
             described are done in full in the kernel",
            counted(copy_cut, "walk", "walks"),
            plural(copy_cut, "was", "were"),
        );
    }
    write!(
        f,
        "{} early, marked [truncated]{why}",
        counted(stacks, "stack ends", "stacks end"),
    )
}

/// How many stacks end early, why, and what to do: a larger window only
/// while one can be asked for.
pub(super) fn stacks_cut(f: &mut fmt::Formatter<'_>, stacks: u64, stack_bytes: u32) -> fmt::Result {
    let max = tracer_common::MAX_STACK_BYTES;
    let remedy = if (stack_bytes as usize) < max {
        format!("raise --stack-bytes, up to {max}")
    } else {
        format!(
            "{max}, the most --stack-bytes allows; for a program built with frame pointers, \
             --unwind fp walks stacks of any depth"
        )
    };
    write!(
        f,
        "{} early, marked [truncated]: deeper than the {stack_bytes} bytes copied ({remedy}) or \
         through code without unwind information",
        counted(stacks, "stack ends", "stacks end"),
    )
}
