//! The report: one `Profile` value, and renderers that take `&Profile` and
//! `impl Write`. Renderers know nothing of BPF.

use std::sync::Arc;

use serde::Serialize;

mod collapsed;
mod distinct;
mod flamegraph;
mod growth;
mod interruptible;
mod json;
mod json_layout;
mod losses;
mod note;
mod notes;
pub mod output;
mod pprof;
mod pprof_meta;
mod render;
mod speedscope;
mod text;

pub use collapsed::write_collapsed;
pub use flamegraph::{write_flamegraph, write_flamegraph_of};
pub use growth::{rate_per_min, sparkline, Sort};
pub use json::write_json;
pub use losses::{write_losses, LossLine, Losses};
pub use note::Note;
pub use output::Output;
pub use pprof::{sample_type_name, write_pprof};
pub use render::{losses_for_stderr, render, Format, RenderOptions};
pub use speedscope::write_speedscope;
pub use text::{write_text, write_text_by};
// For saved profiles (crate::saved): reading pprof, naming folded frames.
pub use collapsed::sanitize as folded_name;
pub use output::Render;
pub use pprof::proto;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

/// Everything a report shows. Built once at the end of a trace.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Profile {
    /// What was traced, as the user named it (e.g. "pid 4242").
    pub target: String,
    /// Wall-clock seconds between attach and the end of the trace.
    pub duration_secs: f64,
    /// Why the trace ended: "duration elapsed", "target exited",
    /// "interrupted (SIGINT)", "terminated (SIGTERM)".
    pub end_reason: String,
    /// Mean sampling interval in bytes; 1 = every allocation recorded (exact).
    pub sample_rate: u64,
    /// How stacks were captured: "dwarf" (copied stacks unwound with CFI in
    /// user space) or "fp" (frame pointers, in the kernel).
    pub unwind: String,
    pub processes: Vec<ProcessInfo>,
    /// The allocator functions that were hooked (or skipped), per object.
    pub hooks: Vec<Hook>,
    /// Sum over all stacks.
    pub totals: Counts,
    /// One entry per unique (process, call stack), sorted by inuse_bytes
    /// descending, then alloc_bytes descending.
    pub stacks: Vec<StackReport>,
    /// What processes that exited during the trace had not freed: no live
    /// process holds it, so it is not in-use (the process whose exit ends a
    /// --pid or -- CMD trace is the exception: its in-use is its heap at
    /// exit).
    pub not_freed_at_exit: NotFreedAtExit,
    pub losses: Losses,
    /// Remarks for the user (skipped optional hooks, limits hit...), put
    /// into words by `report/notes.rs`.
    pub notes: Vec<Note>,
    /// The heap's history (--interval, or --serve's own tick): one point
    /// per snapshot kept, oldest first; each `StackReport::series` has one
    /// value per point. Empty without history.
    pub snapshots: Vec<SnapshotPoint>,
    /// --min-age: only blocks live at least this long at report time are
    /// in use (leak candidates); null without it.
    pub min_age_secs: Option<f64>,
}

/// One snapshot of the heap's history: when, and the totals then.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct SnapshotPoint {
    /// Seconds since the trace started. When the history's resolution was
    /// halved, the time of the later snapshot of each merged pair.
    pub secs: f64,
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
    pub alloc_bytes: u64,
}

/// How a stack's in-use bytes moved over the history (docs/growth.md has
/// the rule and its thresholds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Trend {
    /// Rises across the trace: a leak candidate.
    Growing,
    /// Rose, then stopped: a cache filling up.
    Plateau,
    /// Allocates much more than it keeps, with no trend.
    Churn,
    Stable,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// When it started, in clock ticks after boot (/proc/PID/stat field
    /// 22; null when unknown): with the pid, what tells it from a later
    /// process that reused its pid.
    pub start_time: Option<u64>,
    /// Command line, arguments joined by spaces ("" when unknown).
    pub command: String,
    /// The program it runs: argv[0], or the path memtrace-bpf started or
    /// was given ("" when unknown). Names the process in collapsed stacks
    /// and flamegraphs; unlike `command` it keeps spaces in a path whole.
    pub program: String,
    /// True when the process exited before the report was made.
    pub exited: bool,
    /// How a command started by memtrace-bpf (`-- CMD`) ended, e.g.
    /// "exited with status 0"; null otherwise.
    pub exit_status: Option<String>,
    /// The allocator objects hooked for it (empty when it was not inspected).
    pub allocators: Vec<ProcessAllocator>,
    /// 0 for a process. An entry with pid 0 and `folded` N stands for N
    /// exited processes of `program` whose stacks were summed (only the
    /// last `--exited-processes` exited processes keep their own).
    pub folded: u64,
}

/// One allocator object a process uses and what of it is hooked.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ProcessAllocator {
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc", "interposer" or "own".
    pub kind: String,
    /// Path as the process sees it.
    pub path: String,
    /// Whether malloc and the other standard names resolve here.
    pub resolves_malloc: bool,
    /// Entry points hooked in it.
    pub functions: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Hook {
    /// Allocator function, e.g. "malloc".
    pub function: String,
    /// Path of the object file the probe is attached to.
    pub module: String,
    /// File offset of the function's symbol in `module` (0 when absent).
    pub offset: u64,
    /// File offset where its probes sit: the symbol, or the first
    /// instruction after it that the kernel emulates (see `placement`).
    pub probe_offset: u64,
    /// Why the probes sit there.
    pub placement: String,
    /// "attached", or why not (e.g. "not defined in this libc").
    pub status: String,
}

/// pprof's four sample types, for one stack or for the total.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Counts {
    /// Bytes allocated during the trace and still live at report time.
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
    /// Bytes allocated during the trace, freed or not.
    pub alloc_bytes: u64,
    pub alloc_objects: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StackReport {
    pub pid: u32,
    /// The process's start time (see `ProcessInfo::start_time`).
    pub start_time: Option<u64>,
    /// Null, or the program whose folded exited processes this stack sums
    /// (pid 0; see `ProcessInfo::folded`).
    pub exited_group: Option<String>,
    #[serde(flatten)]
    pub counts: Counts,
    /// Leaf first: frames[0] is the function that called the allocator,
    /// the last frame is the root (e.g. `_start`). Inlined functions appear
    /// as frames of their own, with `inlined: true`.
    /// Shared: a frame named once serves every stack it appears in (a
    /// report of 100 k stacks holds each distinct frame once).
    pub frames: Vec<Arc<Frame>>,
    /// The stack ends before its root: the unwinder ran out of copied stack
    /// bytes or unwind information. Shown as a `[truncated]` root frame.
    pub truncated: bool,
    /// In-use bytes at each of `Profile::snapshots` (empty without history).
    pub series: Vec<u64>,
    /// Least-squares slope of `series` over the snapshots' times; null
    /// with fewer than 2 snapshots.
    pub growth_bytes_per_sec: Option<f64>,
    /// Null with too few snapshots to tell.
    pub trend: Option<Trend>,
}

/// "Not freed at exit", aggregated per program and call stack.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct NotFreedAtExit {
    /// Processes that exited during the trace with blocks not freed.
    pub processes: u64,
    pub bytes: u64,
    pub objects: u64,
    /// Largest first; at most `MAX_EXIT_STACKS` (the rest are counted in
    /// `bytes`, `objects` and `stacks_left_out`).
    pub stacks: Vec<ExitStack>,
    pub stacks_left_out: u64,
}

/// Most entries in `NotFreedAtExit::stacks`.
pub const MAX_EXIT_STACKS: usize = 10_000;

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ExitStack {
    /// The program of the processes (see `ProcessInfo::program`).
    pub program: String,
    /// How many of its processes left blocks from this stack.
    pub processes: u64,
    pub bytes: u64,
    pub objects: u64,
    /// Leaf first, as in `StackReport`.
    pub frames: Vec<Arc<Frame>>,
    pub truncated: bool,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name, or "[unknown]" when it could not be named.
    pub function: String,
    /// Path of the object file ("[unknown]" when the address was in no
    /// mapped file).
    pub module: String,
    /// File offset of the (return address - 1) in `module`.
    pub offset: u64,
    /// Source file and line when debug info exists.
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// Which of the four numbers a collapsed stack or flamegraph shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum View {
    #[default]
    InuseSpace,
    InuseObjects,
    AllocSpace,
    AllocObjects,
}

impl View {
    pub fn value(self, c: &Counts) -> u64 {
        match self {
            View::InuseSpace => c.inuse_bytes,
            View::InuseObjects => c.inuse_objects,
            View::AllocSpace => c.alloc_bytes,
            View::AllocObjects => c.alloc_objects,
        }
    }

    /// Unit name for flamegraph titles and counts.
    pub fn unit(self) -> &'static str {
        match self {
            View::InuseSpace | View::AllocSpace => "bytes",
            View::InuseObjects | View::AllocObjects => "objects",
        }
    }
}

impl View {
    /// What the numbers mean, for titles: "in-use bytes", "allocated objects"...
    pub fn describe(self) -> &'static str {
        match self {
            View::InuseSpace => "in-use bytes",
            View::InuseObjects => "in-use objects",
            View::AllocSpace => "allocated bytes",
            View::AllocObjects => "allocated objects",
        }
    }
}

/// The name symbolization gives a frame it could not name.
const UNKNOWN: &str = "[unknown]";

/// Shown in place of a call stack that was not captured (see
/// `Losses::stack_lost`), so the bytes still appear somewhere.
const NO_STACK: &str = "[no stack]";

/// The root frame of a stack whose walk ended early (`StackReport::truncated`).
const TRUNCATED: &str = "[truncated]";

impl Frame {
    /// True when the symbolizer could not name this frame.
    pub fn is_unknown(&self) -> bool {
        self.function.is_empty() || self.function == UNKNOWN
    }

    /// The name every renderer shows: the function, or for a frame that
    /// could not be named `[unknown] libfoo.so+0x1a2b`, so that distinct
    /// unknown code stays distinct and can be looked up by hand.
    pub fn display_name(&self) -> String {
        if !self.is_unknown() {
            return self.function.clone();
        }
        if self.module.is_empty() || self.module == UNKNOWN {
            format!("{UNKNOWN}+{:#x}", self.offset)
        } else {
            format!("{UNKNOWN} {}+{:#x}", basename(&self.module), self.offset)
        }
    }
}

/// `value` bytes in the largest binary unit that keeps it at 1024 or
/// more of the unit below: (1.5, "KiB") for 1536.
pub fn binary_unit(value: f64) -> (f64, &'static str) {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = value;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    (value, unit)
}

/// `512 B`, `1.5 KiB`, `3.2 GiB`: binary units with one decimal.
pub fn human_bytes(bytes: u64) -> String {
    // Precision loss in the cast is irrelevant at one decimal.
    match binary_unit(bytes as f64) {
        (_, "B") => format!("{bytes} B"),
        (value, unit) => format!("{value:.1} {unit}"),
    }
}

/// `1 stack`, `2 stacks`: a count with its noun in the right number.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", plural(n, one, many))
}

/// `one` for a count of 1, `many` for any other: "was" or "were", "its"
/// or "their". The one plural rule of every message.
pub fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// Last path component: reports name objects by file name, as perf does.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

impl Profile {
    /// `redis-server (pid 4242)`: the program name of process `pid`, or
    /// "pid" when it is unknown (also for pids missing from `processes`,
    /// e.g. children that appeared during the trace). Without `program`
    /// the first word of the command line stands in.
    pub fn process_label(&self, pid: u32, start_time: Option<u64>) -> String {
        let program = self
            .processes
            .iter()
            .find(|proc| proc.pid == pid && proc.start_time == start_time)
            .or_else(|| self.processes.iter().find(|proc| proc.pid == pid))
            .and_then(|proc| match proc.program.as_str() {
                "" => proc.command.split_whitespace().next(),
                program => Some(program),
            })
            .map_or("pid", basename);
        format!("{program} (pid {pid})")
    }

    /// How a stack's process is named in collapsed stacks and flamegraphs:
    /// `redis-server (pid 4242)`, or `python3.11 (812 exited processes)`
    /// for a folded group.
    pub fn stack_label(&self, stack: &StackReport) -> String {
        let Some(program) = &stack.exited_group else {
            return self.process_label(stack.pid, stack.start_time);
        };
        let n = self
            .processes
            .iter()
            .find(|p| p.folded > 0 && &p.program == program)
            .map_or(0, |p| p.folded);
        format!(
            "{} ({})",
            basename(program),
            counted(n, "exited process", "exited processes")
        )
    }

    /// True when stacks of several processes are mixed in this profile, so
    /// renderers must say which process each stack belongs to.
    pub fn is_multi_process(&self) -> bool {
        let key = |s: &StackReport| (s.pid, s.start_time, s.exited_group.clone());
        let first = self.stacks.first().map(key);
        self.processes.len() > 1 || self.stacks.iter().any(|s| Some(key(s)) != first)
    }

    /// How allocations were chosen, in words.
    pub fn sampling_description(&self) -> String {
        // 0 is not a meaningful mean interval: show it like 1 rather than
        // invent a rate.
        if self.sample_rate <= 1 {
            "every allocation (exact)".to_string()
        } else {
            format!(
                "one sample per {} bytes allocated on average (numbers are estimates)",
                self.sample_rate
            )
        }
    }

    /// --min-age, for the text header and pprof's comments.
    pub fn min_age_description(&self) -> Option<String> {
        self.min_age_secs.map(|secs| {
            format!(
                "{secs} s: in use counts only allocations live at least that long; \
                 allocated counts every allocation"
            )
        })
    }
}
