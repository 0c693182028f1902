//! What the session says around the trace: the attach announcement, the
//! end of a started command, the notes about what was traced, and
//! --verbose statistics.

use super::end_reason::{EndReason, EndSignal};
use crate::collect::unwind_notes::KernelUnwind;
use crate::{
    collect::collector::Collector,
    console, escape,
    probes::{hooks::Hooks, loader::Loaded},
    report::{self, Note},
    session::{config::TraceConfig, scope::Scope, Trace},
};

/// Says on stderr what is traced and hooked (and, with --verbose, where
/// each probe sits).
pub fn announce(config: &TraceConfig, scope: &Scope, hooks: &Hooks) {
    if config.verbose {
        for h in hooks.lines() {
            console::say(hook_words(h));
        }
    }
    // Paths the traced processes chose: escaped for the terminal.
    let hooked = escape::text(&hooks.objects().join(", ")).into_owned();
    if matches!(scope, Scope::SystemWide) {
        console::warn(format_args!(
            "tracing every process that uses {hooked}: each of them pays the probe cost on every \
             allocation while the trace runs"
        ));
    }
    if matches!(scope, Scope::Cgroup(_)) {
        console::say(format_args!(
            "processes outside the cgroup that use {hooked} hit the probes too, and are turned \
             away in the kernel by their cgroup"
        ));
    }
    let functions = hooks
        .lines()
        .iter()
        .filter(|h| h.status.is_attached())
        .count();
    console::say(format_args!(
        "tracing {}: {} hooked in {hooked}; {}",
        scope.label(),
        report::counted(
            functions as u64,
            "allocator function",
            "allocator functions"
        ),
        match config.duration {
            Some(d) => format!("reporting in {d} s or on Ctrl-C"),
            None => "press Ctrl-C to stop and report".to_string(),
        }
    ));
}

impl Trace<'_> {
    /// The trace ended before the command it started: the command is told
    /// to stop, as perf record does, and `wind_down` goes on collecting
    /// until it ends (what it does while shutting down is recorded); with
    /// --keep-running it is left running. Returns the report's note.
    pub fn end_command(
        &mut self,
        end_reason: &EndReason,
        wind_down: impl FnOnce(&mut Self) -> anyhow::Result<EndReason>,
    ) -> anyhow::Result<Option<Note>> {
        let Some(command) = self.scope.running_command() else {
            return Ok(None);
        };
        let pid = command.pid;
        if self.settings.config.keep_running {
            return Ok(Some(Note::CommandLeftRunning { pid }));
        }
        // SIGINT and SIGHUP are passed on as they came; anything else
        // (SIGTERM, the duration) asks the command to terminate.
        let signal = end_reason.command_signal();
        let sig = match signal {
            EndSignal::Int => libc::SIGINT,
            EndSignal::Hup => libc::SIGHUP,
            EndSignal::Term => libc::SIGTERM,
        };
        command.signal(sig);
        // A stopped (SIGSTOP, Ctrl-Z) command acts on it only once
        // continued, as shells do for `kill` on a stopped job.
        command.signal(libc::SIGCONT);
        let how = wind_down(self)?.to_string();
        Ok(Some(Note::CommandSignalled {
            pid,
            signal: signal.name(),
            how,
        }))
    }
}

/// A hook for --verbose: where its probes went, when it has any of its own
/// (an alias is counted at the function it aliases, and a hook that was not
/// attached has none).
fn hook_words(h: &crate::probes::plan::HookFact) -> String {
    let mut line = format!(
        "{} at {}+{:#x}: {}",
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
    started: std::time::Instant,
) -> Vec<Note> {
    let mut notes = scope.notes(started);
    notes.extend(scope.fork_notes(loaded));
    for (pid, why) in hooks.failures() {
        notes.push(Note::HookFailed {
            pid: *pid,
            why: why.clone(),
        });
    }
    let execs = collector.execs_not_inspected();
    if execs > 0 {
        notes.push(Note::ExecsNotInspected { execs });
    }
    let blocks = collector.heap().dropped_by_exec;
    if blocks > 0 {
        notes.push(Note::DroppedByExec { blocks });
    }
    notes
}

/// `--verbose`: what user space spent, for tuning and `cargo xtask bench`.
pub fn print_stats(collector: &Collector, kernel: Option<KernelUnwind>) {
    let (live, purged) = collector.live_entries();
    console::say(format_args!(
        "LIVE map: {live} entries at the end; {purged} entries of exited processes deleted"
    ));
    let (frees, unknown) = collector.free_events();
    console::say(format_args!(
        "free events read: {frees}, of blocks with no record: {unknown}"
    ));
    let u = collector.unwind_stats();
    if u.stacks > 0 {
        let secs = u.nanos as f64 / 1e9;
        console::say(format_args!(
            "unwound {} ({}, {} truncated) in {:.1} ms: {:.0} stacks/s",
            report::counted(u.stacks, "stack", "stacks"),
            report::counted(u.frames, "frame", "frames"),
            u.truncated,
            secs * 1e3,
            u.stacks as f64 / secs.max(1e-9)
        ));
        if let (Some(p50), Some(p99), Some(max)) = (
            u.depth_quantile(0.5),
            u.depth_quantile(0.99),
            u.depth_quantile(1.0),
        ) {
            console::say(format_args!(
                "stack bytes complete stacks needed: p50 {p50}, p99 {p99}, max {max} \
                 (--stack-bytes)"
            ));
        }
    }
    if let Some(k) = kernel {
        print_kernel_unwind(&k, collector);
    }
    let u = crate::usage::own();
    console::say(format_args!(
        "tracer CPU {:.3} s user, {:.3} s system; peak RSS {} KiB",
        u.user_secs, u.system_secs, u.peak_rss_kib
    ));
}

/// `--verbose` with uprobe sessions: how many calls paid a return run.
pub fn print_return_runs(r: crate::probes::counters::ReturnRuns) {
    console::say(format_args!(
        "uprobe sessions: {} return runs in traced processes, {} in others \
         (only calls that are recorded or may free a recorded block run their return)",
        r.traced, r.untraced
    ));
}

/// `--unwind tables`: the tables loaded and what the kernel's walker met.
fn print_kernel_unwind(k: &KernelUnwind, collector: &Collector) {
    let t = k.tables;
    console::say(format_args!(
        "unwind tables: {} files, {} of {} rows in use; built {} tables, {} rows in {:.1} ms; \
         kept after their last process: {} reused, {} evicted for rows, {} expired after {} s \
         unused; no table: {} did not fit (--unwind-rows; {} of them to keep tables used in the \
         last {} s, {} not built again; {} loaded later), {} without usable CFI; \
         {} mappings did not fit; {} rows the walker cannot follow",
        t.files,
        t.rows_used,
        t.rows_capacity,
        t.tables_built,
        t.rows_written,
        t.build_nanos as f64 / 1e6,
        t.reused,
        t.evicted,
        t.expired,
        crate::stacks::kernel_tables::UNUSED_TABLE_TTL.as_secs(),
        t.rows_full,
        t.kept_out_recent,
        crate::stacks::kernel_tables::RECENTLY_USED.as_secs(),
        t.not_rebuilt,
        t.loaded_late,
        t.table_errors,
        t.mappings_full,
        t.unsupported_rows,
    ));
    if let Some((path, rows)) = collector.largest_unfit_table() {
        console::say(format_args!(
            "unwind tables: the largest that did not fit: {} ({rows} rows; --unwind-rows is {})",
            crate::escape::text(path),
            t.rows_capacity,
        ));
    }
    console::say(format_args!(
        "kernel walks: {} frame-pointer steps; {} finished from a stack copy ({} here, {} of \
         them cut); ended early: {} at {} frames, {} at unsupported rows, {} at failed reads, \
         {} at bad frames",
        k.fp_steps,
        k.resumed,
        collector.unwind_stats().resumed,
        k.resumed_cut,
        k.truncated,
        tracer_common::MAX_FRAMES,
        k.unsupported,
        k.read_failed,
        k.bad_frame,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::plan::{HookFact, HookStatus, Skip};

    /// The line `announce` says for a hook with --verbose.
    fn hook_line(h: &HookFact) -> String {
        console::said(hook_words(h))
    }

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
