//! `--unwind tables`: what the kernel's walker met, read from its counters
//! (tracer_common::counter::UNWIND_*) and the table manager's counts, as
//! report notes. Stacks the walker could not finish are kept and marked
//! [truncated]; these notes say why, and how to raise the limit.

use aya::maps::{MapData, PerCpuArray};
use tracer_common::counter;

use crate::{probes::counters::read_counter, profile::Note, stacks::kernel_tables::TableStats};

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
    /// Of those, walks whose stack copy did not reach the root (counted in
    /// user space, `UnwindStats::resumed_cut`).
    pub resumed_cut: u64,
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
            resumed_cut: 0,
            tables,
        }
    }

    /// The notes: one for cut stacks by reason, one for tables that did
    /// not fit. Nothing when all went well.
    /// `stack_bytes`: the copy taken where a walk is finished in user space.
    pub fn notes(&self, stacks_cut: u64, stack_bytes: u32) -> Vec<Note> {
        let mut notes = Vec::new();
        if stacks_cut > 0 {
            notes.push(Note::KernelWalksCut {
                stacks: stacks_cut,
                at_limit: self.truncated,
                unsupported: self.unsupported,
                read_failed: self.read_failed,
                bad_frame: self.bad_frame,
                copy_cut: self.resumed_cut,
                stack_bytes,
                max_frames: tracer_common::MAX_FRAMES as u64,
            });
        }
        let t = &self.tables;
        if t.rows_full + t.mappings_full > 0 {
            notes.push(Note::UnwindTablesFull {
                files: t.rows_full,
                rows_capacity: t.rows_capacity,
                mappings: t.mappings_full,
            });
        }
        notes
    }
}
