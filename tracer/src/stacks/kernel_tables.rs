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
//! ```ignore
//! let mut tables = KernelTables::new(Box::new(bpf_maps));
//! tables.prepare(Path::new("/usr/bin/program")); // before it runs: built once
//! tables.sync(pid, &maps, &objects, &jit, |object| Some((file_id_of(object), path_of(object))));
//! tables.drop_process(pid);
//! ```

use std::{
    collections::{BTreeSet, HashMap},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use tracer_common::{MappingKey, MappingValue, MAPPING_FP_ONLY, MAPPING_TABLE};

use super::{
    cfi::load_bias,
    trampolines::{JitCode, Shape},
    unwind_table::{Loads, UnwindTable, ROW_BYTES},
};
use crate::tracee::process::Mapping;

mod bpf;
mod extents;
mod kept;
#[cfg(test)]
mod tests;
mod trampolines;

pub use bpf::BpfUnwindMaps;
use extents::Extents;
use kept::{Evictable, Idle, Stamp};
pub use kept::{RECENTLY_USED, UNUSED_TABLE_TTL};

/// What the manager needs of the BPF maps (a fake in the tests).
pub trait UnwindMaps {
    /// Rows UNWIND_ROWS holds.
    fn rows_capacity(&self) -> u32;
    fn write_rows(&mut self, first: u32, rows: &[u64]) -> anyhow::Result<()>;
    fn insert_mapping(&mut self, key: PrefixKey, value: MappingValue) -> anyhow::Result<()>;
    fn remove_mapping(&mut self, key: PrefixKey) -> anyhow::Result<()>;
    /// After a sync's or a drop's inserts and removes: the walkers' rule
    /// caches are told once, not once per entry.
    fn changed(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// An UNWIND_MAPPINGS key with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    pub prefix_len: u32,
    pub key: MappingKey,
}

/// Counts for `--verbose` and the report's notes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Files with a table in UNWIND_ROWS now.
    pub files: u64,
    pub rows_used: u64,
    pub rows_capacity: u64,
    /// Times a process began to use a file whose table could not be
    /// loaded for lack of rows (its frames in that file follow the
    /// frame-pointer chain instead): raise --unwind-rows. A file counts
    /// once per process that maps it while it does not fit; a trampoline
    /// shape once per read of the maps that found no rows for it.
    pub rows_full: u64,
    /// Of `rows_full`: those that would have fit by evicting kept tables
    /// used in the last RECENTLY_USED (kept, so as not to thrash).
    pub kept_out_recent: u64,
    /// Of `rows_full`: those not even built, their row count known from
    /// an earlier build of the same file (evicted, or did not fit).
    pub not_rebuilt: u64,
    /// Tables loaded for files already in use without one, once their
    /// rows could be had.
    pub loaded_late: u64,
    /// Trampoline shapes with a table in UNWIND_ROWS now (their rows are
    /// in `rows_used`).
    pub trampoline_tables: u64,
    /// Files without a usable table: no CFI, malformed or oversized CFI.
    pub table_errors: u64,
    /// Mappings UNWIND_MAPPINGS had no room for.
    pub mappings_full: u64,
    /// Rows the walker cannot follow (CFA from another register, ...), in
    /// the tables loaded: a stack through one ends there, counted.
    pub unsupported_rows: u64,
    /// Tables built and rows written, and the time spent building and
    /// writing them.
    pub tables_built: u64,
    pub rows_written: u64,
    pub build_nanos: u64,
    /// Kept tables (of files no process used any more) taken again as
    /// they were, instead of built again.
    pub reused: u64,
    /// Kept tables dropped for the rows of a new one (oldest unused
    /// first, none used in the last RECENTLY_USED) or beyond
    /// MAX_UNUSED_FILES, and after UNUSED_TABLE_TTL.
    pub evicted: u64,
    pub expired: u64,
}

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

    /// Describes `pid`'s executable mappings to the walker: `maps` and
    /// `objects` as `Modules` holds them (same index), `open` gives an
    /// object's identity and a path to read it from (None: no table).
    /// `jit`: anonymous executable ranges, walked by frame pointers but
    /// for the CPython trampolines found in them.
    pub fn sync(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        objects: &[u32],
        jit: &JitCode,
        open: impl Fn(u32) -> Option<(FileId, PathBuf)>,
    ) {
        let mut want: HashMap<PrefixKey, MappingValue> = HashMap::new();
        let old = self.procs.remove(&pid).unwrap_or_default();
        let mut shapes = BTreeSet::new();
        self.jit_entries(pid, jit, &mut shapes, &mut want);
        // Each file used is acquired (its users counted) as soon as it is
        // met, so that a table built later in this sync cannot evict it.
        let mut used = BTreeSet::new();
        for (m, &object) in maps.iter().zip(objects) {
            if !m.executable || m.start >= m.end {
                continue;
            }
            let value = match open(object) {
                Some((id, path)) => {
                    if used.insert(id) {
                        self.acquire(id, &path, !old.objects.contains(&id));
                    }
                    match self.files.get(&id) {
                        Some(file) => mapping_value(file, m),
                        None => fp_only(),
                    }
                }
                None => fp_only(),
            };
            for key in prefixes(pid, m.start, m.end) {
                want.insert(key, value);
            }
        }
        for (key, value) in &old.entries {
            if want.get(key) != Some(value) {
                let _ = self.maps.remove_mapping(*key);
            }
        }
        let mut entries = HashMap::with_capacity(want.len());
        let mut changed = old.entries.keys().any(|k| !want.contains_key(k));
        for (key, value) in want {
            if old.entries.get(&key) != Some(&value) {
                changed = true;
                if self.maps.insert_mapping(key, value).is_err() {
                    self.stats.mappings_full += 1;
                    continue;
                }
            }
            entries.insert(key, value);
        }
        if changed {
            let _ = self.maps.changed();
        }
        for object in old.objects {
            self.release(object);
        }
        for shape in old.shapes {
            self.release_shape(shape);
        }
        self.procs.insert(
            pid,
            ProcEntries {
                entries,
                objects: used,
                shapes,
            },
        );
    }

    /// The process exited or exec'ed: its mappings go; the tables no other
    /// process uses are kept unused.
    pub fn drop_process(&mut self, pid: u32) {
        let Some(old) = self.procs.remove(&pid) else {
            return;
        };
        for key in old.entries.keys() {
            let _ = self.maps.remove_mapping(*key);
        }
        if !old.entries.is_empty() {
            let _ = self.maps.changed();
        }
        for object in old.objects {
            self.release(object);
        }
        for shape in old.shapes {
            self.release_shape(shape);
        }
    }

    /// Builds and loads the table of the file at `path` before any process
    /// maps it (a command about to start, the libraries it will load), so
    /// that its first allocations are walked in the kernel. Kept unused
    /// until a process maps it, as a table whose last process has gone.
    pub fn prepare(&mut self, path: &Path) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        let id = (meta.dev(), meta.ino());
        if self.files.contains_key(&id) {
            return;
        }
        let table = self.build(path, (self.clock)());
        if table.stamp.is_some() {
            self.files.insert(id, table);
            self.set_idle(id);
        }
    }

    /// One process more uses file `id`'s table: a kept one as it is when
    /// the file is the same, else built and loaded, unless its row count
    /// is known and that many rows cannot be had. `new_user`: the process
    /// did not use it before this sync (counted then).
    fn acquire(&mut self, id: FileId, path: &Path, new_user: bool) {
        let now = (self.clock)();
        if let Some(f) = self.files.get(&id).filter(|f| f.users == 0) {
            // An inode number is reused once a deleted file is gone: a kept
            // table is the file's only if the file is unchanged.
            let same =
                f.stamp.is_some() && std::fs::metadata(path).ok().map(|m| Stamp::of(&m)) == f.stamp;
            if !same {
                self.free_file(id);
            }
        }
        let mut built = false;
        match self.files.get(&id) {
            None => {
                let table = self.build(path, now);
                self.files.insert(id, table);
                built = true;
            }
            // A stub: built again (in place: its users and idle state
            // stay) only when the rows it needs can be had.
            Some(f) if f.rows.is_none() && f.needed > 0 => {
                if self.could_fit(f.needed, now, Evictable::Idle) {
                    let in_use = f.users > 0;
                    let table = self.build(path, now);
                    if in_use && table.rows.is_some() {
                        self.stats.loaded_late += 1;
                    }
                    if let Some(f) = self.files.get_mut(&id) {
                        (f.rows, f.loads, f.needed) = (table.rows, table.loads, table.needed);
                        f.stamp = table.stamp.or(f.stamp);
                    }
                    built = true;
                } else if new_user {
                    self.stats.not_rebuilt += 1;
                }
            }
            Some(_) => {}
        }
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        if f.idle.take().is_some() {
            self.idle_files -= 1;
            if !built && f.rows.is_some() {
                self.stats.reused += 1;
            }
        }
        f.users += 1;
        let needed = f.needed;
        if new_user && f.rows.is_none() && needed > 0 {
            self.stats.rows_full += 1;
            if self
                .largest_unfit
                .as_ref()
                .is_none_or(|(_, rows)| needed > *rows)
            {
                self.largest_unfit = Some((id, needed));
            }
            if self.could_fit(needed, now, Evictable::AnyUnused) {
                self.stats.kept_out_recent += 1;
            }
        }
    }

    /// The file with the most rows among those whose table did not fit,
    /// and its rows.
    pub fn largest_unfit(&self) -> Option<(FileId, u32)> {
        self.largest_unfit
    }

    /// Builds the table of the file at `path` and writes it into free rows.
    fn build(&mut self, path: &Path, now: Instant) -> FileTable {
        let started = Instant::now();
        let table = self.load(path, now);
        self.stats.tables_built += 1;
        self.stats.build_nanos += started.elapsed().as_nanos() as u64;
        table
    }

    /// Builds a file's table and writes it into a free extent of rows,
    /// evicting unused tables when the free rows are too few.
    fn load(&mut self, path: &Path, now: Instant) -> FileTable {
        let Ok(file) = std::fs::File::open(path) else {
            self.stats.table_errors += 1;
            return FileTable::none(Vec::new(), None);
        };
        let stamp = file.metadata().ok().map(|m| Stamp::of(&m));
        let (loads, built) = UnwindTable::from_file(&file);
        drop(file);
        let built = built.and_then(|t| {
            let unsupported: usize = t.stats.unsupported.iter().sum();
            Ok((t.base, t.encoded()?, unsupported))
        });
        let Ok((base, rows, unsupported)) = built else {
            self.stats.table_errors += 1;
            return FileTable::none(loads, stamp);
        };
        let n = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let Some(first) = self.alloc_rows(n, now) else {
            return FileTable {
                needed: n,
                ..FileTable::none(loads, stamp)
            };
        };
        if self.maps.write_rows(first, &rows).is_err() {
            self.free.release(first, n);
            self.stats.table_errors += 1;
            return FileTable::none(loads, stamp);
        }
        self.stats.files += 1;
        self.stats.unsupported_rows += unsupported as u64;
        self.stats.rows_used += u64::from(n);
        self.stats.rows_written += u64::from(n);
        FileTable {
            rows: Some((first, n, base)),
            ..FileTable::none(loads, stamp)
        }
    }

    /// One process less uses file `id`'s table: kept unused (bounded by
    /// MAX_UNUSED_FILES), or dropped when its file could not be read.
    fn release(&mut self, id: FileId) {
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        f.users = f.users.saturating_sub(1);
        if f.users > 0 {
            return;
        }
        if f.stamp.is_none() {
            self.free_file(id);
            return;
        }
        self.set_idle(id);
    }

    /// Drops file `object`'s entry and frees its rows; whether it had
    /// rows (a table, not a stub).
    fn free_file(&mut self, object: FileId) -> bool {
        let Some(f) = self.files.remove(&object) else {
            return false;
        };
        if f.idle.is_some() {
            self.idle_files -= 1;
        }
        let Some((first, n, _)) = f.rows else {
            return false;
        };
        self.free.release(first, n);
        self.stats.files -= 1;
        self.stats.rows_used -= u64::from(n);
        true
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

/// The tables' footprint now: rows in UNWIND_ROWS (8 bytes each) for
/// `files` files, of which `kept_files` with `kept_rows` rows are kept for
/// files no process maps now; trie entries in UNWIND_MAPPINGS for
/// `processes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesInUse {
    pub files: u64,
    pub rows: u64,
    pub kept_files: u64,
    pub kept_rows: u64,
    pub mappings: u64,
    pub processes: u64,
}

impl FileTable {
    /// A file without a table: its frames take the frame-pointer chain.
    fn none(loads: Loads, stamp: Option<Stamp>) -> FileTable {
        FileTable {
            rows: None,
            loads,
            users: 0,
            stamp,
            idle: None,
            needed: 0,
        }
    }
}

/// A range walked by the frame-pointer chain (JIT code, files without CFI).
fn fp_only() -> MappingValue {
    MappingValue {
        kind: MAPPING_FP_ONLY,
        ..MappingValue::default()
    }
}

/// The walker's view of one executable mapping of `file`.
fn mapping_value(file: &FileTable, m: &Mapping) -> MappingValue {
    let fp_only = fp_only();
    let (Some((first_row, rows, base)), Some(bias)) = (file.rows, load_bias(&file.loads, m)) else {
        return fp_only;
    };
    MappingValue {
        load_base: bias.wrapping_add(base),
        first_row,
        rows,
        kind: MAPPING_TABLE,
        _pad: 0,
    }
}

/// The trie keys covering [start, end) of process `pid`: the largest
/// aligned power-of-two blocks, at most two per address bit.
pub fn prefixes(pid: u32, start: u64, end: u64) -> Vec<PrefixKey> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let mut bits = at.trailing_zeros().min(63);
        while bits > 0 && at.checked_add(1 << bits).is_none_or(|e| e > end) {
            bits -= 1;
        }
        out.push(PrefixKey {
            prefix_len: 32 + (64 - bits),
            key: MappingKey::new(pid, at),
        });
        at += 1 << bits;
    }
    out
}
