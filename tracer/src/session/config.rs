//! What a trace is asked to do, as plain data: `main` turns the command
//! line into this once (`Cli::trace_config`), with every default resolved,
//! and nothing in the session reads the command line again.

use std::{ffi::OsString, net::SocketAddr, path::PathBuf, time::Duration};

use crate::{
    probes::{ProbePlacement, UnwindMode},
    report::{Format, GroupBy, Sort, View},
};

/// What to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `--pid`: a running process.
    Pid(u32),
    /// `-- CMD ARGS`: a command started held, traced from its first
    /// instruction (bytes, passed to it unchanged).
    Command(Vec<OsString>),
    /// `--binary`: every process running the program, as given.
    Binary(PathBuf),
    /// `--cgroup`: every process of a cgroup v2 subtree, as given.
    Cgroup(PathBuf),
    /// No target: every process, but those filtered out.
    SystemWide {
        /// `--comm`: only threads of this name.
        comm: Option<String>,
        /// `--exclude-pid`.
        exclude: Vec<u32>,
    },
}

/// How the report is rendered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderChoice {
    pub format: Format,
    pub view: View,
    /// Stacks in the text report.
    pub top: usize,
    /// Order of the stacks in the text and JSON reports.
    pub sort: Sort,
    /// `--group-by`: the report's top level.
    pub group_by: GroupBy,
}

/// The BPF side: what is recorded and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeChoice {
    /// Every allocation, or about one per so many bytes.
    pub sampling: crate::profile::Sampling,
    pub unwind: UnwindMode,
    pub stack_bytes: u32,
    /// `--unwind tables`: rows of unwind tables the kernel holds.
    pub unwind_rows: u32,
    pub placement: ProbePlacement,
    /// Uprobe session programs where the kernel has them.
    pub sessions: bool,
    /// Benchmarking: probes that do nothing.
    pub noop: bool,
    pub max_live: u32,
    pub stack_storage_size: u32,
    pub ringbuf_mb: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TraceConfig {
    pub target: Target,
    /// Also trace what the target forks (`--pid` and `-- CMD`).
    pub follow_forks: bool,
    /// `-- CMD`: leave it running when the trace ends first.
    pub keep_running: bool,
    /// `-- CMD`: exit with its status.
    pub exit_status: bool,
    /// `--allocator`: auto, a family, or the path of a loaded object.
    pub allocator: String,
    pub duration: Option<f64>,
    /// `--interval`: the heap's history every so many seconds.
    pub interval: Option<Duration>,
    /// `--snapshot-on-peak`: a numbered snapshot when a process's peak
    /// grows by this fraction past its last snapshot's.
    pub snapshot_on_peak: Option<f64>,
    /// `--min-age`: in use counts only blocks at least this old (None: all).
    pub min_age: Option<Duration>,
    pub serve: Option<SocketAddr>,
    /// `--otlp`: its URL, "" when given without one (the environment's or
    /// the default); resolved in `Settings::new`.
    pub otlp: Option<String>,
    pub output: Option<PathBuf>,
    pub render: RenderChoice,
    pub probes: ProbeChoice,
    /// Exited processes whose stacks stay their own.
    pub exited_processes: usize,
    pub verbose: bool,
    pub quiet: bool,
}

impl TraceConfig {
    /// `--pid`'s process.
    pub fn pid(&self) -> Option<u32> {
        match self.target {
            Target::Pid(pid) => Some(pid),
            _ => None,
        }
    }

    /// The command to start, if any.
    pub fn command(&self) -> Option<&[OsString]> {
        match &self.target {
            Target::Command(args) => Some(args),
            _ => None,
        }
    }
}

/// --min-age (or `?min_age=`) as a filter: 0 is none. Validated finite
/// and within a year before.
pub fn min_age(secs: Option<f64>) -> Option<Duration> {
    secs.filter(|&s| s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
}
