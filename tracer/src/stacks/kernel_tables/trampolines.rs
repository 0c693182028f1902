//! The rows of CPython's perf trampolines (`stacks/trampolines.rs`) for the
//! kernel's walker: one table per shape (a copy's layout and stride),
//! built from the shape alone, shared by every span of that shape in
//! every process (each span's entries give its start as the load base),
//! and freed when no process has a span of it any more (a build is a few
//! thousand rows computed, not a file read).
//!
//! Held: per shape loaded, its extent and users; per process, the shapes
//! it uses. What bounds them: shapes are few (one per CPython build:
//! stride 11 in 3.12, 16 in 3.13); at most MAX_SHAPES are loaded, the
//! spans of others are walked by the frame-pointer chain as before. A
//! table is about 12,000 rows (93 KiB) at stride 11.

use std::collections::{BTreeSet, HashMap};

use tracer_common::{MappingValue, MAPPING_TABLE};

use super::{
    mappings::{fp_only, prefixes},
    KernelTables, PrefixKey,
};
use crate::stacks::trampolines::{JitCode, Shape};

/// Shapes loaded at most.
const MAX_SHAPES: usize = 8;

/// One shape's table in UNWIND_ROWS.
pub(super) struct ShapeTable {
    first: u32,
    rows: u32,
    /// Processes with spans of this shape.
    users: u32,
}

impl KernelTables {
    /// Adds to `want` the entries of `pid`'s JIT code: trampoline spans
    /// with their shape's table, the rest of each range walked by the
    /// frame-pointer chain. Each shape used is acquired once (its users
    /// counted) and added to `used`.
    pub(super) fn jit_entries(
        &mut self,
        pid: u32,
        jit: &JitCode,
        used: &mut BTreeSet<Shape>,
        want: &mut HashMap<PrefixKey, MappingValue>,
    ) {
        let mut unfit = BTreeSet::new();
        let mut spans = jit.trampolines().iter().peekable();
        let mut add = |from: u64, to: u64, value: MappingValue| {
            for key in prefixes(pid, from, to) {
                want.insert(key, value);
            }
        };
        for r in jit.ranges().iter().filter(|r| r.start < r.end) {
            let mut at = r.start;
            while let Some(span) = spans.next_if(|s| s.range.start < r.end) {
                let (start, end) = (span.range.start.max(at), span.range.end.min(r.end));
                if start >= end {
                    continue;
                }
                if start > at {
                    add(at, start, fp_only());
                }
                let value = match self.acquire_shape(span.shape, used, &mut unfit) {
                    Some((first_row, rows)) => MappingValue {
                        load_base: span.range.start,
                        first_row,
                        rows,
                        kind: MAPPING_TABLE,
                        _pad: 0,
                    },
                    None => fp_only(),
                };
                add(start, end, value);
                at = end;
            }
            if at < r.end {
                add(at, r.end, fp_only());
            }
        }
    }

    /// The rows of `shape`'s table, loaded if it is not; the process
    /// becomes one of its users the first time it is met in this sync
    /// (added to `used`). None when it cannot be loaded: MAX_SHAPES
    /// loaded, or no rows to be had (counted once a sync in `rows_full`,
    /// remembered in `unfit`).
    fn acquire_shape(
        &mut self,
        shape: Shape,
        used: &mut BTreeSet<Shape>,
        unfit: &mut BTreeSet<Shape>,
    ) -> Option<(u32, u32)> {
        if let Some(t) = self.shapes.get_mut(&shape) {
            if used.insert(shape) {
                t.users += 1;
            }
            return Some((t.first, t.rows));
        }
        if unfit.contains(&shape) || self.shapes.len() >= MAX_SHAPES {
            return None;
        }
        let table = shape.table().encoded().ok()?;
        let n = u32::try_from(table.len()).ok()?;
        let now = (self.clock)();
        let Some(first) = self.alloc_rows(n, now) else {
            unfit.insert(shape);
            self.stats.rows_full += 1;
            return None;
        };
        if self.maps.write_rows(first, &table).is_err() {
            self.free.release(first, n);
            unfit.insert(shape);
            return None;
        }
        self.stats.rows_used += u64::from(n);
        self.stats.rows_written += u64::from(n);
        self.stats.trampoline_tables += 1;
        used.insert(shape);
        let table = ShapeTable {
            first,
            rows: n,
            users: 1,
        };
        self.shapes.insert(shape, table);
        Some((first, n))
    }

    /// One process less uses `shape`'s table: its rows are freed with the
    /// last.
    pub(super) fn release_shape(&mut self, shape: Shape) {
        let Some(t) = self.shapes.get_mut(&shape) else {
            return;
        };
        t.users = t.users.saturating_sub(1);
        if t.users > 0 {
            return;
        }
        if let Some(t) = self.shapes.remove(&shape) {
            self.free.release(t.first, t.rows);
            self.stats.rows_used -= u64::from(t.rows);
            self.stats.trampoline_tables -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
