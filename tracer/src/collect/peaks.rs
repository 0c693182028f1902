//! The peaks of processes that exited (see `model::peak`): taken out of
//! the heap model at the exit, kept by process record until the record is
//! folded into its program's group, whose peak is then the sum of its
//! processes' peaks (not a simultaneous one).
//!
//! Bounded like the process table: one entry per exited process not yet
//! folded (at most --exited-processes, and the trace's root) and one per
//! program group.

use std::collections::HashMap;

use crate::{collect::processes::ProcessIndex, model::peak::ProcessPeak};

#[derive(Debug, Default)]
pub struct EndedPeaks(HashMap<ProcessIndex, ProcessPeak>);

impl EndedPeaks {
    /// Process `i` exited with `peak`.
    pub fn ended(&mut self, i: ProcessIndex, peak: ProcessPeak) {
        self.0.insert(i, peak);
    }

    /// Process `i` is folded into `group`: its peak is added to the
    /// group's and returned (its stacks are merged with it).
    pub fn fold(&mut self, i: ProcessIndex, group: ProcessIndex) -> Option<ProcessPeak> {
        let peak = self.0.remove(&i)?;
        self.0.entry(group).or_default().add_folded(&peak);
        Some(peak)
    }

    pub fn get(&self, i: ProcessIndex) -> Option<&ProcessPeak> {
        self.0.get(&i)
    }
}
