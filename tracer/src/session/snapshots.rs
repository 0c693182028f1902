//! The trace's snapshots while it runs: history ticks, numbered
//! snapshots written with `{n}` in -o, and --otlp's pushes.

use super::{EndReason, Trace};
use crate::{collect::InUseFilter, console, escape};

impl Trace<'_> {
    /// A history tick: the heap's per-stack sums now go into its history;
    /// with `{n}` in -o, the snapshot is also written as a full report with
    /// its number. A failure is said and the trace goes on.
    pub(super) fn history_tick(&mut self) {
        self.snapshots += 1;
        let elapsed = self.started.elapsed();
        let unknown = crate::probes::counters::read_counter(
            &self.loaded.counters,
            tracer_common::counter::UNKNOWN_FREE_BYTES,
        );
        self.collector
            .tick_history(elapsed.as_secs_f64(), unknown, self.memory.resident());
        if self.settings.numbered() {
            self.write_snapshot("the trace went on");
        }
        if self.otlp.is_some() {
            self.push_snapshot();
        }
    }

    /// --otlp: the profile now, queued for the collector (sent by the
    /// exporter's thread: a collector that is down costs the trace
    /// nothing but this snapshot).
    fn push_snapshot(&mut self) {
        let mut profile = self.snapshot(&EndReason::Snapshot(
            "snapshot pushed while tracing (the trace went on)".into(),
        ));
        profile.sort_stacks(self.settings.config.render.sort);
        if let Some(push) = &self.otlp {
            push.profile(&profile);
        }
    }

    /// Writes the next numbered snapshot, `why` in its end reason. A
    /// failure is said and the trace goes on.
    pub(super) fn write_snapshot(&mut self, why: &str) {
        self.numbered += 1;
        let n = self.numbered;
        let elapsed = self.started.elapsed();
        // Off while the snapshot is written: drawn again at the next tick.
        console::clear_progress();
        let in_use = InUseFilter::aged(self.settings.config.min_age);
        let why = EndReason::Snapshot(format!("snapshot {n} ({why})"));
        let mut profile = self.snapshot_at(&why, elapsed, in_use);
        profile.sort_stacks(self.settings.config.render.sort);
        if let Err(e) = self.settings.write_numbered(n, &profile, false) {
            console::warn(format_args!(
                "snapshot {n} not written: {}",
                escape::text(&format!("{e:#}"))
            ));
        }
    }
}
