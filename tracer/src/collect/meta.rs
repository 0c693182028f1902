//! What the session tells the profile builder about the trace, besides
//! what the collector holds.

use std::time::{Duration, Instant};

use crate::{
    collect::unwind_notes::KernelUnwind,
    probes::UnwindMode,
    profile::{Hook, Note, ProcessInfo},
};

/// What the session knows about the trace besides the collected data.
pub struct Meta {
    pub target: String,
    /// Every process traced, by pid.
    pub processes: Vec<ProcessInfo>,
    pub duration: Duration,
    /// When the trace started (what `duration` counts from; event times
    /// such as an OOM kill's are placed against it).
    pub started: Instant,
    /// The same moment in ns since the Unix epoch (the profile's start).
    pub started_unix_ns: Option<u64>,
    pub end_reason: String,
    pub hooks: Vec<Hook>,
    pub unwind: UnwindMode,
    pub stack_bytes: u32,
    pub sampling: crate::profile::Sampling,
    /// Why not, when they were wanted.
    pub session_error: Option<String>,
    /// Why the unwind mode asked for was not used, when it was not.
    pub unwind_fallback: Option<String>,
    /// The allocator objects hooked, e.g. "jemalloc (/usr/lib/.../libjemalloc.so.2)".
    pub allocators: Vec<String>,
    /// Remarks about what was traced (see `Scope::notes`).
    pub scope_notes: Vec<Note>,
    /// `processes[0]` is the process whose exit ends the trace (--pid,
    /// -- CMD): its unfreed blocks stay in in-use.
    pub root_exit_kept: bool,
    /// `-- CMD`: traced from its first instruction (see `unknown_frees_note`).
    pub traced_from_start: bool,
    /// --min-age: in use counts only blocks live at least this long now.
    pub min_age: Option<Duration>,
    /// The end of a served delta window: in use counts only blocks
    /// allocated since this time (`monotonic_ns`); None: every block.
    pub born_since_ns: Option<u64>,
    /// `--unwind tables`: what the kernel's walker met.
    pub kernel_unwind: Option<KernelUnwind>,
    /// --cgroup: the kernel's memory numbers of the cgroup.
    pub cgroup_memory: Option<crate::profile::KernelMemory>,
    /// The kernel's resident bytes of the traced process or cgroup now,
    /// for the history's last point.
    pub resident_now: Option<u64>,
}

/// Which live blocks a profile counts as in use: those live at least
/// `min_age` (--min-age, `?min_age=`), allocated since `born_since_ns`
/// (`monotonic_ns`; a served delta window); every one when both are None.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InUseFilter {
    pub min_age: Option<Duration>,
    pub born_since_ns: Option<u64>,
}

impl InUseFilter {
    /// Blocks live at least `min_age` (every one with None).
    pub fn aged(min_age: Option<Duration>) -> InUseFilter {
        InUseFilter {
            min_age,
            born_since_ns: None,
        }
    }
}
