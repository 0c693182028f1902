//! Command line (clap derive).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::report::View;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Top stacks by in-use bytes, then the loss counters.
    #[default]
    Text,
    /// `root;...;leaf VALUE` lines for speedscope, inferno, flamegraph.pl.
    Collapsed,
    /// SVG flamegraph rendered with inferno.
    Flamegraph,
    /// The whole profile as JSON (schema in README).
    Json,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum UnwindMode {
    /// Copy registers and stack bytes, unwind with DWARF CFI in user space:
    /// complete stacks without frame pointers.
    #[default]
    Dwarf,
    /// Frame-pointer walk in the kernel: cheaper, complete only through code
    /// built with frame pointers.
    Fp,
}

impl UnwindMode {
    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Dwarf => "dwarf",
            UnwindMode::Fp => "fp",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ProbePlacement {
    /// On the first instruction the kernel emulates, when that is safe
    /// (about 1 µs per hit instead of 10–19 µs for a single-stepped one).
    #[default]
    Emulated,
    /// At each function's symbol, as other tracers do.
    Entry,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Sessions {
    #[default]
    Auto,
    Off,
}

/// Trace the heap allocations of a running process with eBPF uprobes and
/// report where its outstanding memory was allocated.
#[derive(Debug, Parser)]
#[command(name = "memtrace-bpf", version, about)]
pub struct Cli {
    /// Process to trace (all of its threads). Without --pid, --binary or a
    /// command, every process on the machine is traced.
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Trace every process running this program, those running now and
    /// those started during the trace.
    #[arg(long, value_name = "PATH", conflicts_with = "pid")]
    pub binary: Option<std::path::PathBuf>,

    /// System-wide: only threads with this name (as in /proc/PID/comm).
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,

    /// System-wide: never trace this process (repeatable).
    #[arg(long = "exclude-pid", value_name = "PID")]
    pub exclude_pid: Vec<u32>,

    /// Command to start and trace from its first instruction, after `--`.
    /// When the trace ends first (--duration, SIGINT, SIGTERM), the command
    /// gets SIGTERM (SIGINT for SIGINT), a few seconds to exit, then SIGKILL.
    #[arg(last = true, value_name = "CMD", conflicts_with_all = ["pid", "binary"])]
    pub command: Vec<std::ffi::OsString>,

    /// With a command: when the trace ends before it, leave it running
    /// (untraced) instead of stopping it.
    #[arg(long, requires = "command")]
    pub keep_running: bool,

    /// With a command: exit with the command's own exit status (128 +
    /// signal number if a signal killed it, as a shell does), after the
    /// report is written.
    #[arg(long, requires = "command", conflicts_with = "keep_running")]
    pub exit_status: bool,

    /// With --pid or a command: also trace every process they fork (and
    /// their children, whatever program they exec), each reported under its
    /// own pid. Hooks the allocator for every process, filtered in the
    /// kernel, as --binary does.
    #[arg(long)]
    pub follow_forks: bool,

    /// Which allocator to hook: `auto` finds, per process, the object its
    /// malloc calls reach (plus any object with jemalloc, tcmalloc or
    /// mimalloc's own functions); `glibc`, `jemalloc`, `tcmalloc`,
    /// `mimalloc` or the path of a loaded object hooks only that one.
    #[arg(long, default_value = "auto", value_name = "NAME|PATH")]
    pub allocator: String,

    /// Stop after this many seconds (default: until Ctrl-C or the target exits).
    #[arg(short, long, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Report format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Write the report here instead of stdout.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Number of stacks in the text report.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,

    /// Which number collapsed stacks and flamegraphs show.
    #[arg(long, value_enum, default_value_t = View::InuseSpace)]
    pub view: View,

    /// Mean bytes allocated between recorded allocations; each recorded one
    /// is weighted to give unbiased estimates. 1 records every allocation
    /// (exact numbers, highest cost). See README for how the default was chosen.
    #[arg(long, default_value_t = 65536, value_name = "BYTES")]
    pub sample_rate: u64,

    /// How call stacks are captured.
    #[arg(long, value_enum, default_value_t = UnwindMode::Dwarf)]
    pub unwind: UnwindMode,

    /// Bytes of stack copied per allocation for DWARF unwinding (4096, 8192,
    /// 12288 or 16384): deeper stacks are cut short and marked [truncated].
    #[arg(long, default_value_t = 8192, value_name = "BYTES")]
    pub stack_bytes: u32,

    /// Where probes sit on each allocator function (see README, Performance).
    #[arg(long, value_enum, default_value_t = ProbePlacement::Emulated)]
    pub probe_placement: ProbePlacement,

    /// Attach the allocating functions as uprobe session programs (kernel
    /// 6.13+), so calls that are not recorded skip the return probe; `off`
    /// uses a uprobe and a uretprobe each. `auto` falls back when the kernel
    /// refuses.
    #[arg(long, value_enum, default_value_t = Sessions::Auto)]
    pub uprobe_sessions: Sessions,

    /// Most allocations tracked as live at once (BPF map size).
    #[arg(long, default_value_t = 1 << 20, value_name = "N")]
    pub max_live: u32,

    /// Most distinct call stacks kept (BPF stack map size).
    #[arg(long, default_value_t = 16384, value_name = "N")]
    pub stack_storage_size: u32,

    /// Size of the kernel-to-user event ring buffer in MiB (a power of two).
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pub ringbuf_mb: u32,

    /// Benchmarking: attach probes that do nothing, at the same places.
    #[arg(long, hide = true)]
    pub noop_probes: bool,

    /// Print what is attached where, and progress, on stderr.
    #[arg(short, long)]
    pub verbose: bool,
}

impl Cli {
    /// Checks that clap cannot express; each message says what to do.
    pub fn validate(&self) -> Result<(), String> {
        let system_wide = self.pid.is_none() && self.binary.is_none() && self.command.is_empty();
        if !system_wide && (self.comm.is_some() || !self.exclude_pid.is_empty()) {
            return Err("--comm and --exclude-pid filter system-wide tracing: drop --pid, --binary and the command".into());
        }
        if self.follow_forks && self.pid.is_none() && self.command.is_empty() {
            return Err(if self.binary.is_some() {
                "--follow-forks follows the children of --pid or of a command: --binary already \
                 traces every process running the program, forked or started (drop \
                 --follow-forks, or trace one of them with --pid PID --follow-forks)"
            } else {
                "--follow-forks follows the children of --pid or of a command: system-wide \
                 tracing already traces every process (add --pid PID or -- CMD)"
            }
            .into());
        }
        if self
            .comm
            .as_ref()
            .is_some_and(|c| c.is_empty() || c.len() > 15)
        {
            return Err("--comm takes a thread name of 1 to 15 bytes, as in /proc/PID/comm".into());
        }
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0) {
                return Err(format!(
                    "--duration must be a positive number of seconds, got {d}"
                ));
            }
        }
        if !self.ringbuf_mb.is_power_of_two() || self.ringbuf_mb > 1024 {
            return Err(format!(
                "--ringbuf-mb must be a power of two between 1 and 1024, got {}",
                self.ringbuf_mb
            ));
        }
        let chunk = tracer_common::STACK_CHUNK as u32;
        let max = tracer_common::MAX_STACK_BYTES as u32;
        if self.stack_bytes == 0
            || !self.stack_bytes.is_multiple_of(chunk)
            || self.stack_bytes > max
        {
            return Err(format!(
                "--stack-bytes must be a multiple of {chunk} from {chunk} to {max}, got {}",
                self.stack_bytes
            ));
        }
        if self.sample_rate == 0 {
            return Err("--sample-rate must be at least 1 (1 records every allocation)".into());
        }
        if self.max_live == 0 || self.stack_storage_size == 0 {
            return Err("--max-live and --stack-storage-size must be at least 1".into());
        }
        if self.format == Format::Flamegraph && self.output.is_none() {
            use std::io::IsTerminal;
            if std::io::stdout().is_terminal() {
                return Err(
                    "--format flamegraph writes SVG: add -o FILE.svg or redirect stdout".into(),
                );
            }
        }
        Ok(())
    }
}
