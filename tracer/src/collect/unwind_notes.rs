//! `--unwind tables`: what the kernel's walker met, read from its counters
//! (tracer_common::counter::UNWIND_*) and the table manager's counts, as
//! report notes. Stacks the walker could not finish are kept and marked
//! [truncated]; these notes say why, and how to raise the limit.

use aya::maps::{MapData, PerCpuArray};
use tracer_common::counter;

use crate::{collect::collector::read_counter, stacks::kernel_tables::TableStats};

/// The walker's counters and the tables' counts at a snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelUnwind {
    /// Stacks cut at MAX_FRAMES.
    pub truncated: u64,
    /// Walks ended at a row the walker cannot follow.
    pub unsupported: u64,
    /// Walks ended at a failed read of user memory.
    pub read_failed: u64,
    /// Walks ended at a frame pointer that was not one.
    pub bad_frame: u64,
    /// Frames taken by the frame-pointer chain.
    pub fp_steps: u64,
    /// Walks that met an address not described yet, finished in user space.
    pub resumed: u64,
    pub tables: TableStats,
}

impl KernelUnwind {
    pub fn read(counters: &PerCpuArray<MapData, u64>, tables: TableStats) -> KernelUnwind {
        let c = |i| read_counter(counters, i);
        KernelUnwind {
            truncated: c(counter::UNWIND_TRUNCATED),
            unsupported: c(counter::UNWIND_UNSUPPORTED),
            read_failed: c(counter::UNWIND_READ_FAILED),
            bad_frame: c(counter::UNWIND_BAD_FRAME),
            fp_steps: c(counter::UNWIND_FP_STEPS),
            resumed: c(counter::UNWIND_RESUMED),
            tables,
        }
    }

    /// The notes: one for cut stacks by reason, one for tables that did
    /// not fit. Nothing when all went well.
    pub fn notes(&self, stacks_cut: u64) -> Vec<String> {
        let mut notes = Vec::new();
        let reasons: Vec<String> = [
            (self.truncated, "deeper than the walker's frames limit"),
            (self.unsupported, "at unwind rules the walker cannot follow"),
            (self.read_failed, "at stack memory that could not be read"),
            (
                self.bad_frame,
                "at a frame without unwind information or frame pointer",
            ),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, why)| format!("{n} {why}"))
        .collect();
        if stacks_cut > 0 {
            let what = match stacks_cut {
                1 => "1 stack ends early".to_string(),
                n => format!("{n} stacks end early"),
            };
            let why = if reasons.is_empty() {
                String::new()
            } else {
                format!(" (kernel walks ended: {})", reasons.join(", "))
            };
            notes.push(format!(
                "{what}, marked [truncated]{why}; the walker stops at {} frames",
                tracer_common::MAX_FRAMES
            ));
        }
        let t = &self.tables;
        if t.rows_full + t.mappings_full > 0 {
            notes.push(format!(
                "unwind tables that did not fit: {} files (their frames follow frame pointers: \
                 raise --unwind-rows from {}), {} mappings",
                t.rows_full, t.rows_capacity, t.mappings_full
            ));
        }
        notes
    }
}
