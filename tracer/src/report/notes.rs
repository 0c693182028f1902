//! Every note in words: the one place the report's remarks are worded,
//! with `counted` and `plural` for every count.

use std::fmt;

use super::{counted, human_bytes, plural, Note};

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::Text(text) => f.write_str(text),
            Note::AllocatorHooked { object } => write!(f, "allocator hooked: {object}"),
            Note::HookFailed { pid, why } => {
                write!(f, "process {pid}: its allocator could not be hooked: {why}")
            }
            Note::NoUprobeSessions { why } => write!(
                f,
                "uprobe sessions unavailable ({why}): every call also pays a return probe"
            ),
            Note::UnwindFallback { why, mode } => write!(
                f,
                "{why}: stacks were captured with --unwind {mode}, the best mode this kernel loads"
            ),
            Note::ExecsNotInspected { execs } => execs_not_inspected(f, *execs),
            Note::DroppedByExec { blocks } => dropped_by_exec(f, *blocks),
            Note::ChildrenNotTraced { children, root } => write!(
                f,
                "{} of pid {root} {} not traced: use --follow-forks",
                counted(*children, "child process", "child processes"),
                plural(*children, "was", "were"),
            ),
            Note::ChildrenNotFollowed { children, max_pids } => {
                children_not_followed(f, *children, *max_pids)
            }
            Note::BinaryProcessesNotTraced {
                processes,
                path,
                max_pids,
            } => binary_not_traced(f, *processes, path, *max_pids),
            Note::PeakSnapshotsCapped { written, skipped } => write!(
                f,
                "--snapshot-on-peak wrote its most, {written} snapshots; {} after them {} not \
                 written (the final report still has the heap at its peak)",
                counted(*skipped, "new high", "new highs"),
                plural(*skipped, "was", "were"),
            ),
            Note::ExecedAway { pid } => write!(
                f,
                "process {pid} exec'ed another program and was no longer traced from then on"
            ),
            Note::CgroupRemoved {
                path,
                removals,
                more,
            } => super::notes_cgroup::removed(f, path, removals, *more),
            Note::ExecsFromThreads { pid, execs } => write!(
                f,
                "process {pid} exec'ed from a thread other than its main one {}: each time its \
                 probes were attached again for its new image, whose allocations until then \
                 are not in the report",
                counted(*execs, "time", "times")
            ),
            Note::RootExited { pid, status } => root_exited(f, *pid, status.as_deref()),
            Note::ProcessesExited {
                processes,
                unfreed,
                bytes,
                objects,
            } => processes_exited(f, *processes, *unfreed, *bytes, *objects),
            Note::UnnamedStacks { stacks, processes } => unnamed_stacks(f, *stacks, *processes),
            Note::Sampled { rate } => sampled(f, *rate),
            Note::UnknownFrees {
                frees,
                bytes,
                traced_from_start,
                live_map_full,
            } => unknown_frees(f, (*frees, *bytes), *traced_from_start, *live_map_full),
            Note::RingbufFull {
                dropped,
                frees_dropped,
                frees_of_dropped_allocs,
            } => ringbuf_full(f, *dropped, *frees_dropped, *frees_of_dropped_allocs),
            Note::ReusedAddresses { allocations } => write!(
                f,
                "{} reused an address whose free was not seen (lost events)",
                counted(*allocations, "allocation", "allocations")
            ),
            Note::UnmatchedFrees { frees, malformed } => unmatched_frees(f, *frees, *malformed),
            Note::FramePointerStacks => f.write_str(FRAME_POINTER_STACKS),
            Note::StacksCut {
                stacks,
                stack_bytes,
            } => stacks_cut(f, *stacks, *stack_bytes),
            Note::KernelWalksCut { .. } => kernel_walks_cut(f, self),
            Note::UnwindTablesFull {
                files,
                rows_capacity,
                mappings,
            } => unwind_tables_full(f, *files, *rows_capacity, *mappings),
            Note::JitNamesIncomplete {
                refused_files,
                capped_entries,
                unnamed_frames,
            } => jit_names_incomplete(f, *refused_files, *capped_entries, *unnamed_frames),
            Note::CommandLeftRunning { pid } => write!(
                f,
                "the command (pid {pid}) was left running, no longer traced (--keep-running)"
            ),
            Note::CommandSignalled { pid, signal, how } => write!(
                f,
                "the trace ended before the command (pid {pid}): it was sent {signal} and {how}"
            ),
            Note::Delta { seconds } => delta(f, *seconds),
            Note::ReadFromPprof => f.write_str(READ_FROM_PPROF),
            Note::NegativeSamples { values } => write!(
                f,
                "{values} negative sample values were read as 0 (a diff profile?)"
            ),
            Note::IgnoredSampleType { name, unit } => write!(
                f,
                "sample type {name}/{unit} is not a heap number memtrace-bpf knows: ignored"
            ),
            Note::OtlpPushes {
                url,
                sent,
                failed,
                dropped,
            } => otlp_pushes(f, url, *sent, *failed, *dropped),
            Note::ModulesWithoutSymbols {
                modules,
                listed,
                debuginfod,
            } => super::symbol_notes::without_symbols(f, *modules, listed, *debuginfod),
            Note::DebuginfodFetches {
                asked,
                found,
                not_found,
                failed,
                unfinished,
                over_cap,
                example,
            } => super::symbol_notes::fetches(
                f,
                (*asked, *found, *not_found),
                (*failed, *unfinished, *over_cap),
                example.as_deref(),
            ),
            Note::DebugLinksRefused { objects, example } => write!(
                f,
                "{} a debug link that is not a bare file name, not followed ({example}): \
                 docs/debug-files.md",
                counted(*objects, "object has", "objects have"),
            ),
            Note::CodeReplaced {
                replaced,
                beyond_history,
            } => code_replaced(f, *replaced, *beyond_history),
        }
    }
}

fn otlp_pushes(
    f: &mut fmt::Formatter<'_>,
    url: &str,
    sent: u64,
    failed: u64,
    dropped: u64,
) -> fmt::Result {
    write!(
        f,
        "OTLP: {} sent to {url}",
        counted(sent, "profile", "profiles")
    )?;
    if failed > 0 || dropped > 0 {
        write!(
            f,
            "; {failed} failed {}, {dropped} dropped (the collector was down, slow or refused \
             them; docs/otlp.md)",
            plural(failed, "send", "sends")
        )?;
    }
    Ok(())
}

const FRAME_POINTER_STACKS: &str = "stacks are frame-pointer walks: code built without frame \
    pointers shows short stacks (--unwind dwarf gives complete ones)";

const READ_FROM_PPROF: &str =
    "read from a pprof file: it has no process list, hooks or loss counters (shown as none)";

fn children_not_followed(f: &mut fmt::Formatter<'_>, children: u64, max_pids: u32) -> fmt::Result {
    write!(
        f,
        "{} could not be followed: {}",
        counted(children, "child process", "child processes"),
        filter_map_full(max_pids)
    )
}

fn unwind_tables_full(
    f: &mut fmt::Formatter<'_>,
    files: u64,
    rows_capacity: u64,
    mappings: u64,
) -> fmt::Result {
    write!(
        f,
        "unwind tables that did not fit: {} (a file each time a process mapped it; their \
         frames follow frame pointers: raise --unwind-rows from {rows_capacity}), {}",
        counted(files, "file", "files"),
        counted(mappings, "mapping", "mappings"),
    )
}

/// Why JIT frames may stay [unknown]: files refused, caps reached.
fn jit_names_incomplete(
    f: &mut fmt::Formatter<'_>,
    refused_files: u64,
    capped_entries: u64,
    unnamed_frames: u64,
) -> fmt::Result {
    let mut parts = Vec::new();
    if refused_files > 0 {
        parts.push(format!(
            "{} refused (a symbolic link on its path, not a regular file, or not owned by the \
             process's user: the tracer reads none of these)",
            counted(
                refused_files,
                "perf map or jitdump file was",
                "perf map or jitdump files were"
            )
        ));
    }
    if capped_entries > 0 {
        parts.push(format!(
            "{} dropped at a process's caps (entries, bytes of names, bytes read: a process \
             keeps its first entries; docs/jit-names.md)",
            counted(capped_entries, "entry was", "entries were"),
        ));
    }
    if unnamed_frames > 0 {
        parts.push(format!(
            "{} left unnamed at the trace's cap on distinct JIT names",
            counted(unnamed_frames, "frame was", "frames were"),
        ));
    }
    write!(
        f,
        "JIT names incomplete, frames in the code concerned stay [unknown]: {}",
        parts.join("; ")
    )
}

/// Why processes or children were not traced: the BPF filter map's size.
fn filter_map_full(max_pids: u32) -> String {
    format!("the process filter map ({max_pids} entries) was full")
}

fn binary_not_traced(
    f: &mut fmt::Formatter<'_>,
    processes: u64,
    path: &str,
    max_pids: u32,
) -> fmt::Result {
    write!(
        f,
        "{} running {} {path} not traced: {}",
        counted(processes, "process", "processes"),
        plural(processes, "was", "were"),
        filter_map_full(max_pids)
    )
}

fn unmatched_frees(f: &mut fmt::Formatter<'_>, frees: u64, malformed: u64) -> fmt::Result {
    write!(
        f,
        "{} without a recorded allocation and {} reached user space",
        counted(frees, "free", "frees"),
        counted(malformed, "malformed event", "malformed events")
    )
}

fn execs_not_inspected(f: &mut fmt::Formatter<'_>, execs: u64) -> fmt::Result {
    write!(
        f,
        "{} not inspected: the trace saw programs start faster than their objects could be read \
         (allocators they brought may not have been hooked; glibc is hooked for all)",
        counted(execs, "exec was", "execs were"),
    )
}

fn dropped_by_exec(f: &mut fmt::Formatter<'_>, n: u64) -> fmt::Result {
    write!(
        f,
        "{} still live when {} process called exec {} dropped from in-use (the new image does \
         not have {})",
        counted(n, "block", "blocks"),
        plural(n, "its", "their"),
        plural(n, "was", "were"),
        plural(n, "it", "them"),
    )
}

fn root_exited(f: &mut fmt::Formatter<'_>, pid: u32, status: Option<&str>) -> fmt::Result {
    write!(
        f,
        "process {pid} {} during the trace: in-use numbers are what it had not freed when it \
         exited",
        status.unwrap_or("exited")
    )
}

fn code_replaced(f: &mut fmt::Formatter<'_>, replaced: u64, beyond: u64) -> fmt::Result {
    if replaced > 0 {
        write!(
            f,
            "{} frames in a library that was unloaded and another loaded in its place \
             before the tracer read the process's maps: those frames are [unknown], not named \
             from the new library",
            super::counted(replaced, "stack has", "stacks have"),
        )?;
    }
    if beyond > 0 {
        write!(
            f,
            "{}{} taken before the last {} executable mappings of their process: \
             named from its maps as read later",
            if replaced > 0 { "; " } else { "" },
            super::counted(beyond, "stack was", "stacks were"),
            tracer_common::CODE_HISTORY,
        )?;
    }
    Ok(())
}

fn unnamed_stacks(f: &mut fmt::Formatter<'_>, stacks: u64, processes: u64) -> fmt::Result {
    write!(
        f,
        "{} of {} have frames shown as [unknown] address: the processes exited or called exec \
         before the tracer could read their memory maps (that image lived a few milliseconds); a \
         command started by memtrace-bpf is held at its exit and keeps them",
        super::counted(stacks, "stack", "stacks"),
        super::counted(processes, "process", "processes"),
    )
}

fn sampled(f: &mut fmt::Formatter<'_>, rate: u64) -> fmt::Result {
    write!(
        f,
        "sampled: one allocation recorded per {rate} bytes allocated on average, each weighted \
         by 1/(1-e^(-size/{rate})); the numbers are estimates (--sample-rate 1 for exact ones)"
    )
}

fn delta(f: &mut fmt::Formatter<'_>, seconds: u64) -> fmt::Result {
    write!(
        f,
        "delta profile: allocated counts are what was allocated over the {seconds} s before this \
         profile; in-use counts are the blocks allocated then that were still live at its end"
    )
}

impl Note {
    /// Whether the note's words contain `pattern`.
    #[cfg(test)]
    pub fn contains(&self, pattern: &str) -> bool {
        self.to_string().contains(pattern)
    }
}

/// Processes that exited during the trace, other than the one whose exit
/// ended it, and what they left unfreed.
fn processes_exited(
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
fn unknown_frees(
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
            "; they handed back {} (glibc's chunk sizes), which the in-use bytes above do not \
             subtract: with --interval, a stack whose rise these frees match while the heap as \
             a whole stays flat is classed replacing (a full cache replacing entries from before \
             the trace), not growing",
            human_bytes(bytes)
        )?;
    }
    Ok(())
}

/// What a full ring buffer did to the numbers (raise --ringbuf-mb).
fn ringbuf_full(
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
fn kernel_walks_cut(f: &mut fmt::Formatter<'_>, note: &Note) -> fmt::Result {
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
fn stacks_cut(f: &mut fmt::Formatter<'_>, stacks: u64, stack_bytes: u32) -> fmt::Result {
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

#[cfg(test)]
mod tests {
    use super::Note;

    #[test]
    fn a_larger_window_is_suggested_only_below_the_largest() {
        let max = tracer_common::MAX_STACK_BYTES as u32;
        let cut = |stack_bytes| {
            Note::StacksCut {
                stacks: 1,
                stack_bytes,
            }
            .to_string()
        };
        let below = cut(max / 2);
        assert!(
            below.contains(&format!("raise --stack-bytes, up to {max}")),
            "{below}"
        );
        let at_max = cut(max);
        assert!(!at_max.contains("raise --stack-bytes"), "{at_max}");
        assert!(at_max.contains("--unwind fp"), "{at_max}");
    }

    fn walks_cut(at_limit: u64, copy_cut: u64, stack_bytes: u32) -> String {
        Note::KernelWalksCut {
            stacks: 2,
            at_limit,
            unsupported: 0,
            read_failed: 0,
            bad_frame: 0,
            copy_cut,
            stack_bytes,
            max_frames: 512,
        }
        .to_string()
    }

    /// Tables mode: stacks cut where a walk was finished from a copy (code
    /// mapped since the maps were read: dlopen) say so and name the copy's
    /// size and the flag; the frame limit is named only when it was met.
    #[test]
    fn kernel_walks_finished_from_a_short_copy_say_why_and_what_to_raise() {
        let max = tracer_common::MAX_STACK_BYTES as u32;
        let copy = walks_cut(0, 587, 8192);
        assert!(
            copy.starts_with(
                "2 stacks end early, marked [truncated]; 587 walks at code mapped after"
            ),
            "{copy}"
        );
        assert!(copy.contains("dlopen"), "{copy}");
        assert!(copy.contains("a copy of 8192 stack bytes"), "{copy}");
        assert!(
            copy.contains(&format!("raise --stack-bytes, up to {max}")),
            "{copy}"
        );
        assert!(!copy.contains("512 frames"), "{copy}");
        let at_max = walks_cut(0, 1, max);
        assert!(at_max.contains("1 walk at code mapped"), "{at_max}");
        assert!(!at_max.contains("raise --stack-bytes"), "{at_max}");
        let both = walks_cut(4, 3, 8192);
        assert!(
            both.contains(
                "(kernel walks ended: 4 deeper than the walker's limit of 512 frames); 3 walks"
            ),
            "{both}"
        );
        let limit = walks_cut(4, 0, 8192);
        assert!(!limit.contains("--stack-bytes"), "{limit}");
    }

    /// JIT frames left [unknown] by a refused perf map or a cap say so.
    #[test]
    fn refused_debug_links_are_counted_with_one_example() {
        let note = Note::DebugLinksRefused {
            objects: 2,
            example: "/app/prog: ../../etc/shadow".into(),
        }
        .to_string();
        assert_eq!(
            note,
            "2 objects have a debug link that is not a bare file name, not followed \
             (/app/prog: ../../etc/shadow): docs/debug-files.md"
        );
    }

    #[test]
    fn jit_names_incomplete_names_what_was_refused_and_capped() {
        let note = |refused_files, capped_entries, unnamed_frames| {
            Note::JitNamesIncomplete {
                refused_files,
                capped_entries,
                unnamed_frames,
            }
            .to_string()
        };
        let refused = note(1, 0, 0);
        assert!(
            refused.starts_with("JIT names incomplete, frames in the code concerned stay [unknown]: 1 perf map or jitdump file was refused (a symbolic link"),
            "{refused}"
        );
        assert!(!refused.contains("caps"), "{refused}");
        let capped = note(0, 4_800_001, 0);
        assert!(
            capped.contains(": 4800001 entries were dropped at a process's caps"),
            "{capped}"
        );
        assert!(!capped.contains("refused"), "{capped}");
        let all = note(2, 1, 3);
        assert!(
            all.contains("2 perf map or jitdump files were refused"),
            "{all}"
        );
        assert!(all.contains("1 entry was dropped"), "{all}");
        assert!(all.contains("3 frames were left unnamed"), "{all}");
    }
}
