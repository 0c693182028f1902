//! The kernel's memory numbers set beside the heap: each process's growth
//! explained from its own stacks (model/explain.rs), and the traced
//! cgroup's from the whole profile's.

use crate::{
    model::explain::{self, HeapWindow},
    profile::{KernelMemory, ProcessInfo, SnapshotPoint, StackReport},
};

/// Fills `growth` in each process's memory and in the cgroup's.
/// `unknown_free_bytes`: what frees of blocks the trace never saw
/// allocated handed back, counted for the whole trace: taken off the
/// heap's growth only when one process was traced.
pub(super) fn fill(
    processes: &mut [ProcessInfo],
    cgroup: Option<&mut KernelMemory>,
    stacks: &[StackReport],
    snapshots: &[SnapshotPoint],
    unknown_free_bytes: u64,
) {
    let single = processes.len() == 1;
    for p in processes.iter_mut() {
        let Some(memory) = p.memory.as_mut() else {
            continue;
        };
        let end: u64 = stacks
            .iter()
            .filter(|s| s.pid == p.pid && s.start_time == p.start_time && s.exited_group.is_none())
            .map(|s| s.counts.inuse_bytes)
            .sum();
        let peak = p.peak.map_or(end, |peak| peak.inuse_bytes.max(end));
        let unknown = if single { unknown_free_bytes } else { 0 };
        let heap = HeapWindow {
            growth: explain::diff(end, unknown),
            peak,
            end,
        };
        memory.growth = Some(explain::explain(&memory.start, &memory.end, heap));
    }
    if let Some(memory) = cgroup {
        let end: u64 = stacks.iter().map(|s| s.counts.inuse_bytes).sum();
        // The whole heap's highest point the history saw (the per-process
        // peaks did not happen at one moment).
        let peak = snapshots.iter().map(|s| s.inuse_bytes).fold(end, u64::max);
        let heap = HeapWindow {
            growth: explain::diff(end, unknown_free_bytes),
            peak,
            end,
        };
        memory.growth = Some(explain::explain(&memory.start, &memory.end, heap));
    }
}
