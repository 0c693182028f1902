//! --snapshot-on-peak: when the trace writes a snapshot for a new high
//! (`model::peak_trigger` says when the heap grew enough), at most one per
//! `GAP` and at most `MAX_PEAK_SNAPSHOTS` in a trace, so that a heap that
//! keeps growing cannot fill the disk; the highs past that bound are
//! counted and the report says so.

use std::time::{Duration, Instant};

use crate::{limits::MAX_PEAK_SNAPSHOTS, profile::Note, session::Trace};

/// Least time between two snapshots.
const GAP: Duration = Duration::from_secs(1);

/// What --snapshot-on-peak wrote so far: two numbers and an instant.
#[derive(Default)]
pub struct PeakSnapshots {
    last: Option<Instant>,
    written: u32,
    /// New highs not written: the bound was reached.
    skipped: u64,
}

/// What to do about the heap's growth now.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    /// Nothing: no new high, or the last snapshot is under `GAP` old.
    Not,
    Write,
    /// A new high past the bound: counted, not written.
    Skip,
}

impl PeakSnapshots {
    fn due(&mut self, grown: bool, now: Instant) -> Due {
        if !grown || self.last.is_some_and(|t| now.duration_since(t) < GAP) {
            return Due::Not;
        }
        self.last = Some(now);
        if self.written >= MAX_PEAK_SNAPSHOTS {
            self.skipped += 1;
            return Due::Skip;
        }
        self.written += 1;
        Due::Write
    }

    /// The report's note when the bound stopped snapshots.
    pub fn note(&self) -> Option<Note> {
        (self.skipped > 0).then_some(Note::PeakSnapshotsCapped {
            written: self.written,
            skipped: self.skipped,
        })
    }
}

impl Trace<'_> {
    /// A numbered snapshot when the trace's heap grew past its threshold,
    /// at most one per `GAP` (a growth within it is written when it is
    /// over: the snapshot holds the peak).
    pub(super) fn peak_snapshot(&mut self) {
        let due = self
            .peak_snapshots
            .due(self.collector.peak_grown(), Instant::now());
        if due != Due::Not {
            self.collector.peak_snapshot_taken();
        }
        if due == Due::Write {
            self.write_snapshot("the trace's heap at a new high; the trace went on");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_heap_that_keeps_growing_then_snapshots_stop_at_the_bound_and_are_counted() {
        let mut s = PeakSnapshots::default();
        let start = Instant::now();
        assert_eq!(s.due(false, start), Due::Not);
        assert_eq!(s.due(true, start), Due::Write);
        assert_eq!(s.due(true, start + GAP / 2), Due::Not, "within the gap");
        for i in 2..=MAX_PEAK_SNAPSHOTS {
            assert_eq!(s.due(true, start + GAP * i), Due::Write);
        }
        assert_eq!(s.note(), None);
        let later = start + GAP * (MAX_PEAK_SNAPSHOTS + 1);
        assert_eq!(s.due(true, later), Due::Skip);
        assert_eq!(s.due(true, later + GAP), Due::Skip);
        assert_eq!(
            s.note(),
            Some(Note::PeakSnapshotsCapped {
                written: MAX_PEAK_SNAPSHOTS,
                skipped: 2
            })
        );
    }
}
