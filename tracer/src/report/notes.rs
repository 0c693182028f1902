//! Every note in words: the one place the report's remarks are worded,
//! with `counted` and `plural` for every count.

use std::fmt;

use super::{counted, plural, Note};

mod events;

use events::{kernel_walks_cut, processes_exited, ringbuf_full, stacks_cut, unknown_frees};

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
            Note::CgroupByProcesses {
                path,
                not_traced,
                max_pids,
            } => super::notes_cgroup::by_processes(f, path, *not_traced, *max_pids),
            Note::ExecsFromThreads { pid, execs } => write!(
                f,
                "process {pid} exec'ed from a thread other than its main one {}: each time its \
                 probes were attached again for its new image, whose allocations until then \
                 are not in the report",
                counted(*execs, "time", "times")
            ),
            _ => words_of_data_and_output(self, f),
        }
    }
}

/// The notes about what was recorded and how the report was made (those
/// about the trace's set-up and scope are worded in `fmt`).
fn words_of_data_and_output(note: &Note, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match note {
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
        Note::KernelWalksCut { .. } => kernel_walks_cut(f, note),
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
        _ => words_of_output(note, f),
    }
}

/// The notes about how the trace ended and how the report was made and
/// pushed.
fn words_of_output(note: &Note, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match note {
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
        // Worded in `fmt` or `words_of_data_and_output`, which hand only the
        // others here: listed, so that a new note must be given a place.
        Note::Text(_)
        | Note::AllocatorHooked { .. }
        | Note::HookFailed { .. }
        | Note::NoUprobeSessions { .. }
        | Note::UnwindFallback { .. }
        | Note::ExecsNotInspected { .. }
        | Note::DroppedByExec { .. }
        | Note::ChildrenNotTraced { .. }
        | Note::ChildrenNotFollowed { .. }
        | Note::BinaryProcessesNotTraced { .. }
        | Note::PeakSnapshotsCapped { .. }
        | Note::ExecedAway { .. }
        | Note::CgroupRemoved { .. }
        | Note::CgroupByProcesses { .. }
        | Note::ExecsFromThreads { .. }
        | Note::RootExited { .. }
        | Note::ProcessesExited { .. }
        | Note::UnnamedStacks { .. }
        | Note::Sampled { .. }
        | Note::UnknownFrees { .. }
        | Note::RingbufFull { .. }
        | Note::ReusedAddresses { .. }
        | Note::UnmatchedFrees { .. }
        | Note::FramePointerStacks
        | Note::StacksCut { .. }
        | Note::KernelWalksCut { .. }
        | Note::UnwindTablesFull { .. }
        | Note::JitNamesIncomplete { .. } => {
            unreachable!("worded before")
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

#[cfg(test)]
mod tests;
