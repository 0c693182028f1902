//! What the session says around the trace: the attach announcement, the
//! end of a started command, the notes about what was traced, and
//! --verbose statistics.

use crate::collect::unwind_notes::KernelUnwind;
use crate::{
    cli::Cli,
    collect::collector::Collector,
    escape,
    probes::{hooks::Hooks, loader::Loaded},
    report,
    session::{scope::Scope, Trace},
};

/// Says on stderr what is traced and hooked (and, with --verbose, where
/// each probe sits).
pub fn announce(cli: &Cli, scope: &Scope, hooks: &Hooks) {
    if cli.verbose {
        for h in &hooks.lines {
            eprintln!("{}", hook_line(h));
        }
    }
    // Paths the traced processes chose: escaped for the terminal.
    let hooked = escape::text(&hooks.objects.join(", ")).into_owned();
    if matches!(scope, Scope::SystemWide) {
        eprintln!(
            "memtrace-bpf: warning: tracing every process that uses {hooked}: each of them pays \
             the probe cost on every allocation while the trace runs"
        );
    }
    let functions = hooks
        .lines
        .iter()
        .filter(|h| h.status.is_attached())
        .count();
    eprintln!(
        "memtrace-bpf: tracing {}: {} hooked in {hooked}; {}",
        scope.label(),
        report::counted(
            functions as u64,
            "allocator function",
            "allocator functions"
        ),
        match cli.duration {
            Some(d) => format!("reporting in {d} s or on Ctrl-C"),
            None => "press Ctrl-C to stop and report".to_string(),
        }
    );
}

impl Trace<'_> {
    /// The trace ended before the command it started: the command is told
    /// to stop, as perf record does, and `wind_down` goes on collecting
    /// until it ends (what it does while shutting down is recorded); with
    /// --keep-running it is left running. Returns the report's note.
    pub fn end_command(
        &mut self,
        end_reason: &str,
        wind_down: impl FnOnce(&mut Self) -> anyhow::Result<String>,
    ) -> anyhow::Result<Option<String>> {
        let Some(command) = self.scope.running_command() else {
            return Ok(None);
        };
        let pid = command.pid;
        if self.settings.cli.keep_running {
            return Ok(Some(format!(
                "the command (pid {pid}) was left running, no longer traced (--keep-running)"
            )));
        }
        let (sig, name) = if end_reason.starts_with("interrupted") {
            (libc::SIGINT, "SIGINT")
        } else {
            (libc::SIGTERM, "SIGTERM")
        };
        command.signal(sig);
        // A stopped (SIGSTOP, Ctrl-Z) command acts on it only once
        // continued, as shells do for `kill` on a stopped job.
        command.signal(libc::SIGCONT);
        let how = wind_down(self)?;
        Ok(Some(format!(
            "the trace ended before the command (pid {pid}): it was sent {name} and {how}"
        )))
    }
}

/// A hook for --verbose: where its probes went, when it has any of its own
/// (an alias is counted at the function it aliases, and a hook that was not
/// attached has none).
fn hook_line(h: &crate::probes::plan::HookFact) -> String {
    let mut line = format!(
        "memtrace-bpf: {} at {}+{:#x}: {}",
        escape::text(&h.function),
        escape::text(&h.module),
        h.offset,
        escape::text(&h.status.to_string()),
    );
    if !h.placement.is_empty() {
        line.push_str(&format!(
            "; probes at {:#x}: {}",
            h.probe_offset,
            escape::text(&h.placement)
        ));
    }
    line
}

/// Remarks about what was traced: the scope's, the children's, hooks that
/// failed, execs not inspected and blocks dropped by exec.
pub fn scope_notes(
    scope: &Scope,
    loaded: &Loaded,
    hooks: &Hooks,
    collector: &Collector,
) -> Vec<String> {
    let mut notes = scope.notes();
    notes.extend(scope.fork_notes(loaded));
    for (pid, why) in &hooks.failures {
        notes.push(format!(
            "process {pid}: its allocator could not be hooked: {why}"
        ));
    }
    let skipped = collector.execs_not_inspected();
    if skipped > 0 {
        notes.push(format!(
            "{} not inspected: the trace saw programs start faster than their objects could \
             be read (allocators they brought may not have been hooked; glibc is hooked for all)",
            report::counted(skipped, "exec was", "execs were"),
        ));
    }
    let n = collector.state.heap.dropped_by_exec;
    if n > 0 {
        notes.push(format!(
            "{} still live when {} process called exec {} dropped from in-use \
             (the new image does not have {})",
            report::counted(n, "block", "blocks"),
            if n == 1 { "its" } else { "their" },
            report::was(n),
            if n == 1 { "it" } else { "them" },
        ));
    }
    notes
}
/// `--verbose`: what user space spent, for tuning and `cargo xtask bench`.
pub fn print_stats(collector: &Collector, kernel: Option<KernelUnwind>) {
    eprintln!(
        "memtrace-bpf: LIVE map: {} entries at the end; {} entries of exited processes deleted",
        collector.state.live_entries(),
        collector.state.purged_live
    );
    let u = collector.state.unwinders.stats;
    if u.stacks > 0 {
        let secs = u.nanos as f64 / 1e9;
        eprintln!(
            "memtrace-bpf: unwound {} ({}, {} truncated) in {:.1} ms: {:.0} stacks/s",
            report::counted(u.stacks, "stack", "stacks"),
            report::counted(u.frames, "frame", "frames"),
            u.truncated,
            secs * 1e3,
            u.stacks as f64 / secs.max(1e-9)
        );
        if let (Some(p50), Some(p99), Some(max)) = (
            u.depth_quantile(0.5),
            u.depth_quantile(0.99),
            u.depth_quantile(1.0),
        ) {
            eprintln!(
                "memtrace-bpf: stack bytes complete stacks needed: p50 {p50}, p99 {p99}, max {max} (--stack-bytes)"
            );
        }
    }
    if let Some(k) = kernel {
        print_kernel_unwind(&k, collector);
    }
    let u = crate::usage::own();
    eprintln!(
        "memtrace-bpf: tracer CPU {:.3} s user, {:.3} s system; peak RSS {} KiB",
        u.user_secs, u.system_secs, u.peak_rss_kib
    );
}

/// `--unwind tables`: the tables loaded and what the kernel's walker met.
fn print_kernel_unwind(k: &KernelUnwind, collector: &Collector) {
    let t = k.tables;
    eprintln!(
        "memtrace-bpf: unwind tables: {} files, {} of {} rows in use; built {} rows in {:.1} ms; \
         no table: {} did not fit (--unwind-rows), {} without usable CFI; {} mappings did not fit; \
         {} rows the walker cannot follow",
        t.files,
        t.rows_used,
        t.rows_capacity,
        t.rows_written,
        t.build_nanos as f64 / 1e6,
        t.rows_full,
        t.table_errors,
        t.mappings_full,
        t.unsupported_rows,
    );
    eprintln!(
        "memtrace-bpf: kernel walks: {} frame-pointer steps; {} finished from a stack copy ({} here); \
         ended early: {} at {} frames, {} at unsupported rows, {} at failed reads, {} at bad frames",
        k.fp_steps,
        k.resumed,
        collector.state.unwinders.stats.resumed,
        k.truncated,
        tracer_common::MAX_FRAMES,
        k.unsupported,
        k.read_failed,
        k.bad_frame,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::plan::{HookFact, HookStatus, Skip};

    fn fact(status: HookStatus, probe_offset: u64, placement: &str) -> HookFact {
        HookFact {
            function: "memalign".into(),
            module: "/lib/libc.so.6".into(),
            offset: 0x99610,
            probe_offset,
            placement: placement.into(),
            status,
        }
    }

    #[test]
    fn a_hook_without_probes_of_its_own_shows_no_probe_address() {
        let alias = fact(
            HookStatus::Skipped(Skip::Alias {
                of: "aligned_alloc".into(),
            }),
            0,
            "",
        );
        assert_eq!(
            hook_line(&alias),
            "memtrace-bpf: memalign at /lib/libc.so.6+0x99610: alias of aligned_alloc, counted there"
        );
        let attached = fact(
            HookStatus::Attached { session: false },
            0x99617,
            "+7: `push rbx` is emulated",
        );
        assert!(
            hook_line(&attached)
                .ends_with("attached; probes at 0x99617: +7: `push rbx` is emulated"),
            "{}",
            hook_line(&attached)
        );
    }
}
