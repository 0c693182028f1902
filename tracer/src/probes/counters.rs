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
