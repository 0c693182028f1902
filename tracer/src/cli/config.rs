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
                sampling: crate::profile::Sampling::from_rate(self.sample_rate),
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

/// `--unwind` not given: tables; a kernel whose verifier refuses them
/// falls back to dwarf, then fp, when the programs are loaded.
fn default_unwind() -> UnwindMode {
    UnwindMode::Tables
}
