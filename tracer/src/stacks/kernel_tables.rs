//! Unwind tables in the kernel's maps (`--unwind tables`): each
//! mapped file's rows (`unwind_table.rs`) loaded once into UNWIND_ROWS and
//! shared by every process that maps the file; per process,
//! UNWIND_MAPPINGS tells the BPF walker which rows and which load address
//! apply to an address. `Modules` calls `sync` whenever it reads a
//! process's maps, and `drop_process` when they are gone.
//!
//! A table whose last process has gone is kept (`kept.rs`), so that a
//! program run again and again (a shell loop, a build) does not have its
//! tables built each time: reused as it is when a process maps the same
//! file again, evicted oldest-unused first when a new table needs rows
//! that are not free (but not within RECENTLY_USED of its last use: no
//! thrash), and after UNUSED_TABLE_TTL unused.
//!
//! Whatever does not fit is counted, never cut: a table larger than the
//! free rows and those of evictable tables is not loaded at all (that
//! file's frames take the frame-pointer chain, `rows_full`; loaded later
//! once the rows can be had, `waiting`), a mapping the trie has no room
//! for is left out (the walk hands that frame to user space,
//! `mappings_full`).
//!
//! Anonymous executable memory (JIT code) is walked by the frame-pointer
//! chain, except CPython's perf trampolines, which have rows of their own
//! (`trampolines.rs`).
//!
//! Held here: per file mapped by a live process or kept, a `FileTable`
//! (about 130 bytes, its PT_LOAD list, a hash slot); per process, its trie
//! entries (key and value, about 40 bytes each, typically 30 to 60) and
//! the sets of files and trampoline shapes it uses; all of a process's go
//! at `drop_process`.
//!
//! Each file's table is built, shared and released in `file_tables.rs`;
//! each process's trie entries are written in `mappings.rs`; the counts
//! are `stats.rs`'s; the maps are reached through `UnwindMaps`
//! (`unwind_maps.rs`, on the real maps `bpf.rs`).
//!
//! ```ignore
//! let mut tables = KernelTables::new(Box::new(bpf_maps));
//! tables.prepare(Path::new("/usr/bin/program")); // before it runs: built once
//! tables.sync(pid, &maps, &objects, &jit, |object| Some((file_id_of(object), path_of(object))));
//! tables.drop_process(pid);
//! ```

use std::{
    collections::{BTreeSet, HashMap},
    time::Instant,
};

use tracer_common::MappingValue;

use super::{
    trampolines::Shape,
    unwind_table::{Loads, ROW_BYTES},
};

mod bpf;
mod extents;
mod file_tables;
mod kept;
mod mappings;
mod stats;
#[cfg(test)]
mod tests;
mod trampolines;
mod unwind_maps;

pub use bpf::BpfUnwindMaps;
use extents::Extents;
use kept::{Idle, Stamp};
pub use kept::{RECENTLY_USED, UNUSED_TABLE_TTL};
pub use stats::{TableStats, TablesInUse};
pub use unwind_maps::{PrefixKey, UnwindMaps};

/// One file's table as loaded (or not).
struct FileTable {
    /// `(first row, rows, table base)`; None: frame-pointer chain only.
    rows: Option<(u32, u32, u64)>,
    /// PT_LOAD segments, for each mapping's load bias.
    loads: Loads,
    /// Processes whose mappings use it.
    users: u32,
    /// The file as it was when the table was built (None: it could not be
    /// read, and the entry goes with its last user).
    stamp: Option<Stamp>,
    /// Since when no process uses it (built ahead by `prepare`, or its
    /// last user gone); None while in use.
    idle: Option<Idle>,
    /// With no rows: the rows its table needs (known from a build: it
    /// did not fit, or it was evicted), 0 when unknown or no table can be
    /// built. Built again only once that many can be had.
    needed: u32,
}

/// Which file: (device, inode), as `Modules` identifies objects.
pub type FileId = (u64, u64);

#[derive(Default)]
struct ProcEntries {
    entries: HashMap<PrefixKey, MappingValue>,
    /// The files they use, once each.
    objects: BTreeSet<FileId>,
    /// The trampoline shapes their JIT code uses, once each.
    shapes: BTreeSet<Shape>,
}

pub struct KernelTables {
    maps: Box<dyn UnwindMaps>,
    /// One per file identity.
    files: HashMap<FileId, FileTable>,
    /// Tables of CPython's perf trampolines, one per shape.
    shapes: HashMap<Shape, trampolines::ShapeTable>,
    free: Extents,
    procs: HashMap<u32, ProcEntries>,
    /// Entries of `files` no process uses, and the release order's source.
    idle_files: usize,
    idle_seq: u64,
    /// `Instant::now`, or a fake clock in the tests.
    clock: Box<dyn Fn() -> Instant>,
    pub stats: TableStats,
    /// The file with the most rows among those that did not fit, and its
    /// rows (`--verbose` names it: how far to raise --unwind-rows). One
    /// entry, replaced by a larger one.
    largest_unfit: Option<(FileId, u32)>,
}

impl KernelTables {
    pub fn new(maps: Box<dyn UnwindMaps>) -> KernelTables {
        let capacity = maps.rows_capacity();
        KernelTables {
            maps,
            files: HashMap::new(),
            shapes: HashMap::new(),
            free: Extents::new(capacity),
            procs: HashMap::new(),
            idle_files: 0,
            idle_seq: 0,
            clock: Box::new(Instant::now),
            stats: TableStats {
                rows_capacity: u64::from(capacity),
                ..TableStats::default()
            },
            largest_unfit: None,
        }
    }

    /// The file with the most rows among those whose table did not fit,
    /// and its rows.
    pub fn largest_unfit(&self) -> Option<(FileId, u32)> {
        self.largest_unfit
    }

    /// Bytes of UNWIND_ROWS in use.
    pub fn bytes_used(&self) -> u64 {
        self.stats.rows_used * ROW_BYTES as u64
    }

    /// Files with a table entry (loaded or not) and processes described.
    pub fn held(&self) -> (usize, usize) {
        (self.files.len(), self.procs.len())
    }

    /// What the tables hold now (--verbose's stats line, the soak).
    pub fn in_use(&self) -> TablesInUse {
        let kept = self.files.values().filter(|f| f.idle.is_some());
        let (kept_files, kept_rows) = kept.fold((0, 0), |(f, r), t| match t.rows {
            Some((_, n, _)) => (f + 1, r + u64::from(n)),
            None => (f, r),
        });
        TablesInUse {
            files: self.stats.files,
            rows: self.stats.rows_used,
            kept_files,
            kept_rows,
            mappings: self.procs.values().map(|p| p.entries.len() as u64).sum(),
            processes: self.procs.len() as u64,
        }
    }
}
