//! Command line (clap derive).

use std::path::PathBuf;

use clap::Parser;
pub use run::{run_here, validated};

use crate::{
    probes::{ProbePlacement, Sessions, UnwindMode},
    report::{Format, GroupBy, Sort, View},
};

mod addr;
mod config;
mod help;
mod run;

pub use addr::{parse_addr, AgentAddress};

/// Trace the heap allocations of a running process with eBPF uprobes and
/// report where its outstanding memory was allocated.
#[derive(Debug, Parser)]
#[command(
    name = "memtrace-bpf",
    version,
    about,
    after_help = "Saved profiles (no privileges needed; see `memtrace-bpf report --help`):\n  \
                  memtrace-bpf report FILE [--format F] [-o PATH]   re-render a saved JSON or pprof profile\n  \
                  memtrace-bpf diff OLD NEW [--format F] [-o PATH]  per-stack changes NEW - OLD"
)]
pub struct Cli {
    /// Process to trace (all of its threads). Without --pid, --binary or a
    /// command, every process on the machine is traced.
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Trace every process running this program, those running now and
    /// those started during the trace.
    #[arg(long, value_name = "PATH", conflicts_with = "pid")]
    pub binary: Option<std::path::PathBuf>,

    /// Trace every process of this cgroup v2 subtree (a container, a
    /// systemd service or slice, a Kubernetes pod), those in it now and
    /// those that join it or cgroups made below it during the trace: a
    /// directory under the cgroup2 mount, or a path relative to it (as on
    /// the `0::` line of /proc/PID/cgroup).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["pid", "binary"])]
    pub cgroup: Option<std::path::PathBuf>,

    /// The top level of the report: `process` (each process its own),
    /// `cgroup` or `container` (each cgroup, or each container, pod or
    /// unit, with the processes in it summed): the text report's first
    /// table, the root frame of collapsed stacks and flamegraphs, JSON's
    /// `groups`.
    #[arg(long, value_enum, default_value_t = GroupBy::Process)]
    pub group_by: GroupBy,

    /// System-wide: only threads with this name (as in /proc/PID/comm).
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,

    /// System-wide: never trace this process (repeatable).
    #[arg(long = "exclude-pid", value_name = "PID")]
    pub exclude_pid: Vec<u32>,

    /// Command to start and trace from its first instruction, after `--`.
    /// When the trace ends first (--duration, SIGINT, SIGTERM, SIGHUP), the
    /// command gets SIGTERM (SIGINT or SIGHUP for those), a few seconds to
    /// exit, then SIGKILL.
    #[arg(last = true, value_name = "CMD", conflicts_with_all = ["pid", "binary", "cgroup"])]
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

    // Help in help.rs: clap reads `{n}` in a doc comment as a line break.
    #[arg(long, value_name = "SECS", help = help::interval())]
    pub interval: Option<f64>,

    #[arg(
        long,
        value_name = "FRACTION",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "0.1",
        value_parser = parse_fraction,
        help = help::snapshot_on_peak()
    )]
    pub snapshot_on_peak: Option<f64>,

    /// Count as in use only the allocations live for at least SECS when the
    /// report (or snapshot) is made: leak candidates, not what the program
    /// holds for a moment. Allocated counts still count every allocation.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub min_age: Option<f64>,

    /// Order of the stacks in the text and JSON reports: `inuse` (largest
    /// in-use bytes first) or `growth` (fastest growing first). Default:
    /// growth with --interval, inuse without.
    #[arg(long, value_enum, value_name = "ORDER")]
    pub sort: Option<Sort>,

    /// Serve the profile over HTTP while tracing, on HOST:PORT (`:PORT`
    /// is 127.0.0.1:PORT; port 0 picks a free one): /debug/pprof/heap and
    /// /debug/pprof/allocs for `go tool pprof` and profile scrapers,
    /// /metrics for Prometheus, /flamegraph.svg, /profile.json. Without
    /// --interval, the heap's history is recorded every 5 s for them.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_addr)]
    pub serve: Option<std::net::SocketAddr>,

    /// Run the trace through a running `memtrace-bpf agent`: its Unix
    /// socket's path or its HOST:PORT (docs/agent.md). Takes --pid,
    /// --binary or --cgroup, -d, --sample-rate, --interval, --min-age, -f
    /// and -o.
    #[arg(long, value_name = "SOCKET|HOST:PORT", value_parser = AgentAddress::parse)]
    pub agent: Option<AgentAddress>,

    /// Push the profile to an OpenTelemetry collector as OTLP profiles
    /// (OTLP/HTTP protobuf, http:// only) at each --interval tick and at the
    /// end. URL without a path: /v1development/profiles is added. Without
    /// URL: OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT
    /// or http://localhost:4318, as OpenTelemetry SDKs read them; headers from
    /// OTEL_EXPORTER_OTLP_(PROFILES_)HEADERS. docs/otlp.md.
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub otlp: Option<String>,

    /// Report format.
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub format: Format,

    /// Write the report here instead of stdout.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,

    /// Exited processes whose stacks stay their own in the report (the
    /// last N to exit); older ones are summed per program, so that a trace
    /// of thousands of processes keeps bounded memory.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub exited_processes: usize,

    /// Number of stacks in the text report.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,

    /// Which number collapsed stacks and flamegraphs show, and pprof's
    /// default sample type.
    #[arg(long, value_enum, default_value_t = View::InuseSpace)]
    pub view: View,

    /// Mean bytes allocated between recorded allocations; each recorded one
    /// is weighted to give unbiased estimates. 1 records every allocation
    /// (exact numbers, highest cost). docs/performance.md says how the default was chosen.
    #[arg(long, default_value_t = 65536, value_name = "BYTES")]
    pub sample_rate: u64,

    /// How call stacks are captured [default: tables; where the kernel's
    /// verifier refuses a mode, the next one of tables, dwarf, fp is used,
    /// and said].
    #[arg(long, value_enum)]
    pub unwind: Option<UnwindMode>,

    /// Bytes of stack copied per allocation for DWARF unwinding (4096, 8192,
    /// 12288 or 16384): deeper stacks are cut short and marked [truncated].
    #[arg(long, default_value_t = 8192, value_name = "BYTES")]
    pub stack_bytes: u32,

    /// `--unwind tables`: rows of unwind tables the kernel holds, 8 bytes
    /// each, shared by all processes (a python3 process maps about 110,000).
    /// A file whose table does not fit is walked by frame pointers and
    /// counted.
    #[arg(long, default_value_t = 1 << 21, value_name = "ROWS")]
    pub unwind_rows: u32,

    /// Where probes sit on each allocator function (docs/design.md, "Probe placement").
    #[arg(long, value_enum, default_value_t = ProbePlacement::Emulated)]
    pub probe_placement: ProbePlacement,

    /// Attach the allocating functions as uprobe session programs (kernel
    /// 6.13+), so calls that are not recorded skip the return probe; `off`
    /// uses a uprobe and a uretprobe each. `auto` falls back when the kernel
    /// refuses.
    #[arg(long, value_enum, default_value_t = Sessions::Auto)]
    pub uprobe_sessions: Sessions,

    /// Most allocations tracked as live at once (the BPF map's size when
    /// sampling; in exact mode the tracer's own live set).
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

    /// No progress line on stderr while tracing (it is shown only when
    /// stderr is a terminal).
    #[arg(short, long)]
    pub quiet: bool,
}

use crate::limits::{
    MAX_DURATION_SECS, MAX_LIVE, MAX_SAMPLE_RATE, MAX_STACK_STORAGE, MIN_INTERVAL_SECS,
    SNAPSHOT_NUMBER,
};

impl Cli {
    /// --sort, or its default: growth with --interval, in-use without.
    pub fn sort(&self) -> Sort {
        match (self.sort, self.interval) {
            (Some(sort), _) => sort,
            (None, Some(_)) => Sort::Growth,
            (None, None) => Sort::Inuse,
        }
    }

    /// Checks that clap cannot express; each message says what to do.
    /// Every number is bounded here, before anything is loaded or attached,
    /// so no value can overflow later.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_target()?;
        self.validate_numbers()?;
        self.validate_output()
    }

    fn validate_target(&self) -> Result<(), String> {
        let system_wide = self.pid.is_none()
            && self.binary.is_none()
            && self.cgroup.is_none()
            && self.command.is_empty();
        if !system_wide && (self.comm.is_some() || !self.exclude_pid.is_empty()) {
            return Err("--comm and --exclude-pid filter system-wide tracing: drop --pid, --binary, --cgroup and the command".into());
        }
        if self
            .cgroup
            .as_ref()
            .is_some_and(|c| c.as_os_str().is_empty())
        {
            return Err("--cgroup takes a cgroup v2 directory, or a path relative to the cgroup2 mount, not an empty string".into());
        }
        // clap's `requires` does not see the trailing command as absent.
        if self.command.is_empty() {
            for (set, flag) in [
                (self.exit_status, "--exit-status"),
                (self.keep_running, "--keep-running"),
            ] {
                if set {
                    return Err(format!(
                        "{flag} applies to a command memtrace-bpf starts (`-- CMD ARGS`): a \
                         process traced with --pid, --binary or system-wide is not its child and \
                         always runs on after the trace; drop {flag}"
                    ));
                }
            }
        }
        if self.follow_forks && self.pid.is_none() && self.command.is_empty() {
            return Err(if self.cgroup.is_some() {
                "--follow-forks follows the children of --pid or of a command: --cgroup already \
                 traces every process of the cgroup, forked or moved in (drop --follow-forks)"
            } else if self.binary.is_some() {
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
        if self.allocator.is_empty() {
            return Err(format!(
                "--allocator takes {}, not an empty string",
                crate::tracee::entry_points::AllocatorKind::choices()
            ));
        }
        Ok(())
    }

    fn validate_numbers(&self) -> Result<(), String> {
        if let Some(d) = self.duration {
            if !(d.is_finite() && d > 0.0 && d <= MAX_DURATION_SECS) {
                return Err(format!(
                    "--duration must be a positive number of seconds up to {MAX_DURATION_SECS} (a year), got {d}"
                ));
            }
        }
        if let Some(age) = self.min_age {
            if !(age.is_finite() && (0.0..=MAX_DURATION_SECS).contains(&age)) {
                return Err(format!(
                    "--min-age takes the seconds an allocation must have been live to count as \
                     in use, from 0 to {MAX_DURATION_SECS} (a year), got {age}"
                ));
            }
        }
        if self.top == 0 {
            return Err(
                "--top must be at least 1: it is how many stacks the text report lists".into(),
            );
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
        if !(1024..=1 << 27).contains(&self.unwind_rows) {
            return Err(format!(
                "--unwind-rows must be from 1024 to {} (1 GiB of rows), got {}",
                1u32 << 27,
                self.unwind_rows
            ));
        }
        if self.sample_rate == 0 || self.sample_rate > MAX_SAMPLE_RATE {
            return Err(format!(
                "--sample-rate must be from 1 (records every allocation) to {MAX_SAMPLE_RATE} bytes, got {}",
                self.sample_rate
            ));
        }
        if self.max_live == 0 || self.max_live > MAX_LIVE {
            return Err(format!(
                "--max-live must be from 1 to {MAX_LIVE}, got {}",
                self.max_live
            ));
        }
        if self.stack_storage_size == 0 || self.stack_storage_size > MAX_STACK_STORAGE {
            return Err(format!(
                "--stack-storage-size must be from 1 to {MAX_STACK_STORAGE}, got {}",
                self.stack_storage_size
            ));
        }
        Ok(())
    }

    fn validate_output(&self) -> Result<(), String> {
        let numbered = self
            .output
            .as_ref()
            .is_some_and(|o| o.to_string_lossy().contains(SNAPSHOT_NUMBER));
        if self.snapshot_on_peak.is_some() && !numbered {
            return Err(
                "--snapshot-on-peak writes numbered snapshots: give -o a path with {n}, e.g. \
                 -o heap-{n}.json"
                    .into(),
            );
        }
        match (self.interval, numbered) {
            (Some(i), _)
                if !(i.is_finite() && (MIN_INTERVAL_SECS..=MAX_DURATION_SECS).contains(&i)) =>
            {
                return Err(format!(
                    "--interval must be from {MIN_INTERVAL_SECS} to {MAX_DURATION_SECS} seconds, got {i}"
                ));
            }
            (None, true) if self.snapshot_on_peak.is_none() => {
                return Err("-o has {n} (a snapshot's number): add --interval SECS or \
                     --snapshot-on-peak to take snapshots, or name one file"
                    .into());
            }
            _ => {}
        }
        if self.sort == Some(Sort::Growth) && self.interval.is_none() && self.serve.is_none() {
            return Err(
                "--sort growth ranks stacks by their growth over the heap's history: add \
                 --interval SECS to record one"
                    .into(),
            );
        }
        use std::io::IsTerminal;
        crate::report::check_destination(
            self.format,
            self.output.is_some(),
            std::io::stdout().is_terminal(),
        )?;
        Ok(())
    }
}

/// `--snapshot-on-peak`'s FRACTION: `0.1` or `10%`, above 0 and at most
/// 100 (a heap 101 times its last snapshot's).
fn parse_fraction(text: &str) -> Result<f64, String> {
    let value = match text.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => text.trim().parse::<f64>(),
    };
    match value {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 100.0 => Ok(f),
        _ => Err(format!(
            "--snapshot-on-peak takes how much the traced heap must grow past its last \
             snapshot's highest, as a fraction above 0 and at most 100 (e.g. 0.1 or 10%), got \
             {text:?}"
        )),
    }
}

#[cfg(test)]
mod tests;
