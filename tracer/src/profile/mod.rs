//! The profile: everything a report shows, as data. Built by collect/
//! (or read back by saved/), rendered by report/; model/ and stacks/ use
//! its counts and frames. Nothing here writes or words anything: the
//! renderers and `report/notes.rs` do.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod frames;
mod kernel_memory;
mod losses;
mod map_frames;
mod note;
mod sampling;

pub use frames::Frames;
pub use kernel_memory::{GrowthExplained, KernelMemory, MemorySample, MIN_GROWTH};
pub use losses::Losses;
pub use map_frames::FramesAt;
pub use note::{CgroupRemoval, Note};
pub use sampling::Sampling;

/// The profile as the tracer holds it: each stack's frames a `Frames`.
pub type Profile = ProfileOf<Frames>;
pub type StackReport = StackReportOf<Frames>;
pub type NotFreedAtExit = NotFreedAtExitOf<Frames>;
pub type ExitStack = ExitStackOf<Frames>;

/// Everything a report shows. Built once at the end of a trace. `F` is
/// how a list of frames is held: `Frames` in memory (`Profile`); a saved
/// file is read with the form its lists are written in, then converted
/// (`map_frames`, saved/read_json). Every field may be absent from a saved
/// file (fields were added over time): it reads as its default.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, bound(deserialize = "F: Deserialize<'de> + Default"))]
pub struct ProfileOf<F> {
    /// What was traced, as the user named it (e.g. "pid 4242").
    pub target: String,
    /// Wall-clock seconds between attach and the end of the trace.
    pub duration_secs: f64,
    /// When the trace attached, in nanoseconds since the Unix epoch (the
    /// realtime clock); None for a saved file that does not say (written
    /// before it was kept, or a pprof without `time_nanos`).
    pub start_unix_ns: Option<u64>,
    /// Why the trace ended: "duration elapsed", "target exited",
    /// "interrupted (SIGINT)", "terminated (SIGTERM)", "hung up (SIGHUP)".
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
    pub stacks: Vec<StackReportOf<F>>,
    /// What processes that exited during the trace had not freed: no live
    /// process holds it, so it is not in-use (the process whose exit ends a
    /// --pid or -- CMD trace is the exception: its in-use is its heap at
    /// exit).
    pub not_freed_at_exit: NotFreedAtExitOf<F>,
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
    /// Traced processes the OOM killer chose during the trace (those kept
    /// have `ProcessInfo::oom_killed`; docs/oom-and-temporary.md).
    pub oom_kills: u64,
    /// Temporary allocations of every stack: exact mode only, null when
    /// sampling (docs/oom-and-temporary.md).
    pub temporary: Option<Temporary>,
    /// `--group-by`: the report's top level (docs/cgroups.md).
    pub group_by: GroupBy,
    /// --cgroup: what the kernel counted of the cgroup's memory, beside
    /// its traced heap (null for other scopes, or without a memory
    /// controller to read).
    pub cgroup_memory: Option<KernelMemory>,
}

/// What the top level of a report is: each process, each cgroup, or each
/// container (or pod, or systemd unit).
/// A saved file's grouping that is not one of these (or null) reads as
/// `Process`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    #[default]
    Process,
    Cgroup,
    Container,
}

impl<'de> Deserialize<'de> for GroupBy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GroupBy, D::Error> {
        Ok(match Option::<String>::deserialize(d)?.as_deref() {
            Some("cgroup") => GroupBy::Cgroup,
            Some("container") => GroupBy::Container,
            _ => GroupBy::Process,
        })
    }
}

/// Allocations freed by the thread that made them before its next
/// allocation (heaptrack's "temporary"), and their bytes.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Temporary {
    pub objects: u64,
    pub bytes: u64,
}

impl Temporary {
    pub fn add(&mut self, other: Temporary) {
        self.objects += other.objects;
        self.bytes += other.bytes;
    }
}

/// A process the OOM killer chose: when, and its traced heap then (what
/// it had allocated during the trace and not freed when it died; kept in
/// the report's in-use).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct OomKilled {
    /// Seconds since the trace started.
    pub secs: f64,
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
}

/// One snapshot of the heap's history: when, and the totals then.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SnapshotPoint {
    /// Seconds since the trace started. When the history's resolution was
    /// halved, the time of the later snapshot of each merged pair.
    pub secs: f64,
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
    pub alloc_bytes: u64,
    /// The resident bytes the kernel counted then, of the traced process
    /// or cgroup (null for other scopes, or when not read).
    pub resident_bytes: Option<u64>,
}

impl Profile {
    /// What the trace recorded, from `sample_rate`.
    pub fn sampling(&self) -> Sampling {
        Sampling::from_rate(self.sample_rate)
    }
}

/// How a stack's in-use bytes moved over the history (docs/growth.md has
/// the rule and its thresholds).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Trend {
    /// Rises across the trace: a leak candidate.
    Growing,
    /// Rose, then stopped: a cache filling up.
    Plateau,
    /// Allocates much more than it keeps, with no trend.
    Churn,
    Stable,
    /// Rises, but frees of blocks allocated before the trace handed back
    /// as much while the heap as a whole stayed flat: a full cache
    /// replacing entries it held before the trace (not a leak).
    Replacing,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
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
    /// Null, or when the OOM killer chose it and its heap then.
    pub oom_killed: Option<OomKilled>,
    /// Its stacks' temporary allocations (exact mode; null when sampling).
    pub temporary: Option<Temporary>,
    /// Its traced heap at its highest (null when it allocated nothing
    /// traced); for a folded group, the sum of its processes' peaks.
    pub peak: Option<Peak>,
    /// What the kernel counted of its memory over the trace, beside its
    /// heap (null when not read: see docs/growth.md).
    pub memory: Option<KernelMemory>,
    /// Its cgroup, container, namespace pid (docs/cgroups.md).
    #[serde(flatten)]
    pub identity: Identity,
}

/// A process's traced in-use at its highest moment (docs/peak.md).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Peak {
    /// Seconds after the trace started; null for a folded group (its
    /// processes peaked at different times).
    pub secs: Option<f64>,
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
}

/// Where a process runs: its cgroup v2 and what the cgroup's path names,
/// its pid in its own pid namespace, its program as its own root shows it.
/// Each is null when unknown or not named. Read from /proc, which the
/// process controls in part (a container picks its own cgroup names):
/// bounded when read, escaped by the renderers.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Identity {
    /// Its cgroup v2 path from the hierarchy's root (`/system.slice/x.service`).
    pub cgroup: Option<String>,
    /// The container id its cgroup names (`docker-<id>.scope`,
    /// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`,
    /// or `/docker/<id>`).
    pub container_id: Option<String>,
    /// The Kubernetes pod UID its cgroup names (`kubepods…pod<uid>`), with
    /// dashes.
    pub pod_uid: Option<String>,
    /// The systemd unit (`.service` or `.scope`) its cgroup names.
    pub unit: Option<String>,
    /// Its pid in its own pid namespace, when it has one (NSpid).
    pub ns_pid: Option<u32>,
    /// The program it runs as its own root shows it, when that differs from
    /// this host's root (a container's mount namespace, a chroot).
    pub ns_program: Option<String>,
}

impl Identity {
    /// Container ids are 64 hex digits (12 and more are accepted: short
    /// ids).
    pub fn is_container_id(id: &str) -> bool {
        (12..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
    }

    /// A pod UID: 8-4-4-4-12 hex digits.
    pub fn is_pod_uid(s: &str) -> bool {
        let groups: Vec<&str> = s.split('-').collect();
        groups.len() == 5
            && groups
                .iter()
                .zip([8, 4, 4, 4, 12])
                .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
    }
}

/// One allocator object a process uses and what of it is hooked.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
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

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
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
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Counts {
    /// Bytes allocated during the trace and still live at report time.
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
    /// Bytes allocated during the trace, freed or not.
    pub alloc_bytes: u64,
    pub alloc_objects: u64,
    /// In use at the peak of the stack's process (docs/peak.md). Summed
    /// over processes (totals, several processes' stacks), a sum of
    /// per-process peaks, not a heap that existed at one moment.
    pub peak_inuse_bytes: u64,
    pub peak_inuse_objects: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, bound(deserialize = "F: Deserialize<'de> + Default"))]
pub struct StackReportOf<F> {
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
    /// report of 100 k stacks holds each distinct frame once), and the
    /// stacks of one report are slices of one list (`Frames`).
    pub frames: F,
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
    /// Its temporary allocations (exact mode; null when sampling),
    /// written as `temporary_objects` and `temporary_bytes`.
    #[serde(flatten, with = "map_frames::stack_temporary")]
    pub temporary: Option<Temporary>,
}

/// "Not freed at exit", aggregated per program and call stack.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, bound(deserialize = "F: Deserialize<'de> + Default"))]
pub struct NotFreedAtExitOf<F> {
    /// Processes that exited during the trace with blocks not freed.
    pub processes: u64,
    pub bytes: u64,
    pub objects: u64,
    /// Largest first; at most `MAX_EXIT_STACKS` (the rest are counted in
    /// `bytes`, `objects` and `stacks_left_out`).
    pub stacks: Vec<ExitStackOf<F>>,
    pub stacks_left_out: u64,
}

/// Most entries in `NotFreedAtExit::stacks`.
pub const MAX_EXIT_STACKS: usize = 10_000;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, bound(deserialize = "F: Deserialize<'de> + Default"))]
pub struct ExitStackOf<F> {
    /// The program of the processes (see `ProcessInfo::program`).
    pub program: String,
    /// How many of its processes left blocks from this stack.
    pub processes: u64,
    pub bytes: u64,
    pub objects: u64,
    /// Leaf first, as in `StackReport`.
    pub frames: F,
    pub truncated: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
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
    /// The GNU build id of `module` in hex, when it has one: with `offset`,
    /// what names the frame later where the debug files are
    /// (docs/debug-files.md). Shared by the frames of one module; left out
    /// of the JSON when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<Arc<str>>,
}
