//! Reading the BPF programs' per-CPU counters (tracer_common::counter).

use aya::maps::{MapData, PerCpuArray};

use crate::report::Losses;

/// One per-CPU counter (tracer_common::counter), summed.
pub fn read_counter(counters: &PerCpuArray<MapData, u64>, index: u32) -> u64 {
    counters
        .get(&index, 0)
        .map(|per_cpu| per_cpu.iter().sum())
        .unwrap_or(0)
}

/// Sums the per-CPU loss counters (the table in report::losses).
pub fn read_losses(counters: &PerCpuArray<MapData, u64>) -> Losses {
    Losses::read(|index| read_counter(counters, index))
}

/// Uprobe sessions: how many allocating calls had their return run
/// (tracer_common::counter::RETURN_RUNS*), for --verbose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReturnRuns {
    /// In traced processes: the recorded calls and the resizing calls
    /// that may free a recorded block.
    pub traced: u64,
    /// In other processes mapping a hooked file (none once the session
    /// link is set up).
    pub untraced: u64,
}

pub fn read_return_runs(counters: &PerCpuArray<MapData, u64>) -> ReturnRuns {
    ReturnRuns {
        traced: read_counter(counters, tracer_common::counter::RETURN_RUNS),
        untraced: read_counter(counters, tracer_common::counter::RETURN_RUNS_UNTRACED),
    }
}
