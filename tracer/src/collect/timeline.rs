//! A report's view of the heap's history: the points, a point for the
//! report's time, and each stack's series, slope and trend.

use crate::{
    model::{
        heap::StackHandle,
        history::{self, History},
        trend,
    },
    profile::{Counts, Sampling, SnapshotPoint, Trend},
};

/// The history's points and, unless the last tick was now, a point for
/// now: the last point of a report is the report's time.
pub(super) struct Timeline<'a> {
    history: &'a History,
    now: Option<f64>,
    secs: Vec<f64>,
    /// Bytes per second: the traced heap's in-use bytes, and what frees of
    /// blocks the trace never saw allocated handed back (None: no slope).
    heap_rate: Option<f64>,
    unknown_rate: Option<f64>,
}

#[derive(Default)]
pub(super) struct Growth {
    pub series: Vec<u64>,
    pub per_sec: Option<f64>,
    pub trend: Option<Trend>,
}

impl<'a> Timeline<'a> {
    /// `heap_now`: the heap's in-use bytes and the unknown frees' bytes
    /// now, the point for now if there is one.
    pub(super) fn new(history: &'a History, now: f64, heap_now: (u64, u64)) -> Timeline<'a> {
        let points = history.points();
        let mut secs: Vec<f64> = points.iter().map(|p| p.secs).collect();
        let now = match secs.last() {
            Some(&last) if last >= now => None,
            _ => Some(now),
        };
        secs.extend(now);
        let (mut heap, mut unknown): (Vec<u64>, Vec<u64>) = points
            .iter()
            .map(|p| (p.inuse_bytes, p.unknown_free_bytes))
            .unzip();
        if now.is_some() {
            heap.push(heap_now.0);
            unknown.push(heap_now.1);
        }
        Timeline {
            history,
            now,
            heap_rate: trend::slope(&secs, &heap),
            unknown_rate: trend::slope(&secs, &unknown),
            secs,
        }
    }

    /// A stack's series, slope and trend; nothing for a stack without a
    /// series (beyond `history::MAX_STACKS`).
    pub(super) fn growth(&self, h: StackHandle, counts: &Counts, sampling: Sampling) -> Growth {
        let Some(past) = self.history.series(h) else {
            return Growth::default();
        };
        let mut series = past.to_vec();
        if self.now.is_some() {
            series.push(counts.inuse_bytes);
        }
        let per_sec = trend::slope(&self.secs, &series);
        let mut trend = trend::classify(&self.secs, &series, counts, sampling);
        if trend == Some(Trend::Growing) {
            if let (Some(stack), Some(heap), Some(unknown)) =
                (per_sec, self.heap_rate, self.unknown_rate)
            {
                if trend::replacing(stack, unknown, heap) {
                    trend = Some(Trend::Replacing);
                }
            }
        }
        Growth {
            series,
            per_sec,
            trend,
        }
    }

    /// The history's points and the one for now (`totals`, and the
    /// kernel's resident bytes now).
    pub(super) fn snapshots(&self, totals: &Counts, resident: Option<u64>) -> Vec<SnapshotPoint> {
        let point = |p: &history::Point| SnapshotPoint {
            secs: p.secs,
            inuse_bytes: p.inuse_bytes,
            inuse_objects: p.inuse_objects,
            alloc_bytes: p.alloc_bytes,
            resident_bytes: p.resident_bytes,
        };
        let mut points: Vec<SnapshotPoint> = self.history.points().iter().map(point).collect();
        if let Some(secs) = self.now {
            points.push(SnapshotPoint {
                secs,
                inuse_bytes: totals.inuse_bytes,
                inuse_objects: totals.inuse_objects,
                alloc_bytes: totals.alloc_bytes,
                resident_bytes: resident,
            });
        }
        points
    }
}
