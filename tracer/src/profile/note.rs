//! A remark the report makes to the user, as a fact: which note, with the
//! numbers and names it needs. `report/notes.rs` puts each one into words;
//! the JSON keeps those words (an array of strings), so a profile read back
//! from a file carries them as `Note::Text`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A note read from a saved profile: only its words are known.
    Text(String),
    /// An allocator object hooked, e.g. "jemalloc (/usr/lib/.../libjemalloc.so.2)".
    AllocatorHooked { object: String },
    /// The allocator of process `pid` could not be hooked.
    HookFailed { pid: u32, why: String },
    /// Uprobe sessions were wanted but unavailable.
    NoUprobeSessions { why: String },
    /// The unwind mode asked for was rejected by the kernel's verifier;
    /// `mode` was used instead.
    UnwindFallback { why: String, mode: String },
    /// Execs the session could not inspect in time.
    ExecsNotInspected { execs: u64 },
    /// Blocks still live when their process called exec.
    DroppedByExec { blocks: u64 },
    /// Children of `root` not traced (no --follow-forks).
    ChildrenNotTraced { children: u64, root: u32 },
    /// Children not followed: the process filter map (`max_pids`) was full.
    ChildrenNotFollowed { children: u64, max_pids: u32 },
    /// --binary: processes running `path` not traced, the filter map full.
    BinaryProcessesNotTraced {
        processes: u64,
        path: String,
        max_pids: u32,
    },
    /// --snapshot-on-peak wrote its most snapshots (`written`); `skipped`
    /// later new highs were not written.
    PeakSnapshotsCapped { written: u32, skipped: u64 },
    /// --pid, -- CMD: the traced process exec'ed `execs` times from a
    /// thread other than its main one; each time its probes were attached
    /// again, and what its new image allocated before is not seen.
    ExecsFromThreads { pid: u32, execs: u64 },
    /// --binary: process `pid` exec'ed another program.
    ExecedAway { pid: u32 },
    /// --cgroup: the cgroup at `path` (as given, resolved in the
    /// hierarchy) was removed during the trace, each time as `removals`
    /// says (the first ones, bounded), `more` times beyond those.
    CgroupRemoved {
        path: String,
        removals: Vec<CgroupRemoval>,
        more: u64,
    },
    /// --cgroup on a kernel that offers uprobe programs no cgroup
    /// ancestry: the cgroup at `path` was followed by its process list;
    /// `not_traced` of its processes found the filter map (`max_pids`)
    /// full.
    CgroupByProcesses {
        path: String,
        not_traced: u64,
        max_pids: u32,
    },
    /// The process whose exit ended the trace; `status` as `ProcessInfo::exit_status`.
    RootExited { pid: u32, status: Option<String> },
    /// Other processes that exited during the trace, and what `unfreed` of
    /// them left unfreed (`bytes`, `objects`).
    ProcessesExited {
        processes: u64,
        unfreed: u64,
        bytes: u64,
        objects: u64,
    },
    /// Stacks of `processes` processes whose maps were never read.
    UnnamedStacks { stacks: u64, processes: u64 },
    /// Sampling at a mean of `rate` bytes.
    Sampled { rate: u64 },
    /// Frees of blocks the trace never saw allocated (counter `unknown_frees`).
    UnknownFrees {
        frees: u64,
        /// What they handed back, where the allocator tells (0: unknown).
        bytes: u64,
        traced_from_start: bool,
        live_map_full: bool,
    },
    /// The ring buffer was full: counters `ringbuf_full`, `frees_dropped`
    /// and `frees_of_dropped_allocs`.
    RingbufFull {
        dropped: u64,
        frees_dropped: u64,
        frees_of_dropped_allocs: u64,
    },
    /// Allocations at an address whose free was not seen.
    ReusedAddresses { allocations: u64 },
    /// Frees without a recorded allocation, and malformed events.
    UnmatchedFrees { frees: u64, malformed: u64 },
    /// --unwind fp.
    FramePointerStacks,
    /// Stacks marked truncated, with the --stack-bytes window.
    StacksCut { stacks: u64, stack_bytes: u32 },
    /// --unwind tables: stacks the kernel's walk ended early, by reason
    /// (walks cut at the frame limit, at rules it cannot follow, at
    /// unreadable memory, at a frame with neither table nor frame pointer;
    /// walks finished from a `stack_bytes` copy, at code not described to
    /// the kernel yet, whose copy did not reach the root).
    KernelWalksCut {
        stacks: u64,
        at_limit: u64,
        unsupported: u64,
        read_failed: u64,
        bad_frame: u64,
        copy_cut: u64,
        stack_bytes: u32,
        max_frames: u64,
    },
    /// --unwind tables: files whose table did not fit in the rows map
    /// (`rows_capacity`; a file once per process that mapped it), and
    /// mappings the mapping map had no room for.
    UnwindTablesFull {
        files: u64,
        rows_capacity: u64,
        mappings: u64,
    },
    /// JIT names that could not be had: perf maps or jitdump files
    /// refused (a symlink, not a regular file, not the process's user's),
    /// entries dropped at a process's caps, and frames left unnamed at the
    /// trace's cap on interned names.
    JitNamesIncomplete {
        refused_files: u64,
        capped_entries: u64,
        unnamed_frames: u64,
    },
    /// Objects whose `.gnu_debuglink` names no bare file name (`../`, a
    /// path): not followed. `example` is one of them, "object: link", both
    /// escaped (the traced process chose them).
    DebugLinksRefused { objects: u64, example: String },
    /// Stacks with frames where other code was mapped after the stack was
    /// taken and before the maps were read (a library unloaded and another
    /// loaded in its place): those frames are unnamed (`replaced`). And
    /// stacks older than the kernel side's memory of mappings reaches
    /// (`beyond_history`), named from the maps as read.
    CodeReplaced { replaced: u64, beyond_history: u64 },
    /// Objects with frames left `[unknown]` and nothing that names them
    /// (`DebugInfo::symbols` false, no debug file fetched): how many, and
    /// the first `MAX_LISTED` as "path (build id ID)", escaped (the traced
    /// process chose the paths). `debuginfod`: DEBUGINFOD_URLS was set.
    ModulesWithoutSymbols {
        modules: u64,
        listed: Vec<String>,
        debuginfod: bool,
    },
    /// DEBUGINFOD_URLS: what became of the debug files asked for
    /// (`stacks::debuginfod::Stats`).
    DebuginfodFetches {
        asked: u64,
        found: u64,
        not_found: u64,
        failed: u64,
        unfinished: u64,
        over_cap: u64,
        example: Option<String>,
    },
    /// -- CMD with --keep-running: the command outlived the trace.
    CommandLeftRunning { pid: u32 },
    /// -- CMD: the trace ended first; the command was sent `signal` and
    /// then `how` ("exited with status 0"...).
    CommandSignalled {
        pid: u32,
        signal: &'static str,
        how: String,
    },
    /// A delta profile of the server (`/debug/pprof/heap?seconds=`,
    /// `/debug/pprof/allocs?seconds=`).
    Delta { seconds: u64 },
    /// Read from a pprof file, which has no process list, hooks or losses.
    ReadFromPprof,
    /// Negative sample values of a pprof file read as 0.
    NegativeSamples { values: u64 },
    /// A pprof sample type that is not a heap number.
    IgnoredSampleType { name: String, unit: String },
    /// --otlp: what became of the pushes to `url` (`otlp::Stats`).
    OtlpPushes {
        url: String,
        sent: u64,
        failed: u64,
        dropped: u64,
    },
}

/// When the traced cgroup was removed, and when a cgroup was made again
/// at its path (None: not by the end of the trace), from the trace's
/// start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupRemoval {
    pub removed: std::time::Duration,
    pub made_again: Option<std::time::Duration>,
}

impl From<String> for Note {
    fn from(text: String) -> Note {
        Note::Text(text)
    }
}

impl From<&str> for Note {
    fn from(text: &str) -> Note {
        Note::Text(text.to_string())
    }
}

/// A note is saved as its words.
impl Serialize for Note {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// From its words: a note read back is a `Note::Text`.
impl<'de> Deserialize<'de> for Note {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Note, D::Error> {
        String::deserialize(d).map(Note::Text)
    }
}
