//! The command line as the trace's plain config (`session::TraceConfig`),
//! made once in `main` after `validate`.

use std::time::Duration;

use super::Cli;
use crate::{
    probes::{Sessions, UnwindMode},
    session::config::{min_age, ProbeChoice, RenderChoice, Target, TraceConfig},
};

impl Cli {
    /// Every default resolved: the target, the sort order, the min age.
    pub fn trace_config(&self) -> TraceConfig {
        let target = if let Some(pid) = self.pid {
            Target::Pid(pid)
        } else if !self.command.is_empty() {
            Target::Command(self.command.clone())
        } else if let Some(binary) = &self.binary {
            Target::Binary(binary.clone())
        } else if let Some(cgroup) = &self.cgroup {
            Target::Cgroup(cgroup.clone())
        } else {
            Target::SystemWide {
                comm: self.comm.clone(),
                exclude: self.exclude_pid.clone(),
            }
        };
        TraceConfig {
            target,
            follow_forks: self.follow_forks,
            keep_running: self.keep_running,
            exit_status: self.exit_status,
            allocator: self.allocator.clone(),
            duration: self.duration,
            interval: self.interval.map(Duration::from_secs_f64),
            snapshot_on_peak: self.snapshot_on_peak,
            min_age: min_age(self.min_age),
            serve: self.serve,
            otlp: self.otlp.clone(),
            output: self.output.clone(),
            render: RenderChoice {
                format: self.format,
                view: self.view,
                top: self.top,
                sort: self.sort(),
                group_by: self.group_by,
            },
            probes: ProbeChoice {
                sample_rate: self.sample_rate,
                unwind: self.unwind.unwrap_or_else(default_unwind),
                stack_bytes: self.stack_bytes,
                unwind_rows: self.unwind_rows,
                placement: self.probe_placement,
                sessions: self.uprobe_sessions == Sessions::Auto,
                noop: self.noop_probes,
                max_live: self.max_live,
                stack_storage_size: self.stack_storage_size,
                ringbuf_mb: self.ringbuf_mb,
            },
            exited_processes: self.exited_processes,
            verbose: self.verbose,
            quiet: self.quiet,
        }
    }
}

/// `--unwind` not given: tables, where the kernel has `bpf_loop` (5.17);
/// before that, DWARF unwinding of stack copies, said once.
fn default_unwind() -> UnwindMode {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(['.', '-']).map(|n| n.trim().parse::<u32>());
    let version = match (numbers.next(), numbers.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor),
        _ => return UnwindMode::Tables, // unknown: try; a failed load says why
    };
    if version >= (5, 17) {
        return UnwindMode::Tables;
    }
    crate::console::say(format_args!(
        "kernel {} has no bpf_loop (5.17+): stacks are unwound from stack copies \
         in user space (--unwind dwarf, cut at --stack-bytes)",
        release.trim()
    ));
    UnwindMode::Dwarf
}
