//! Unwind tables in the kernel's maps (`--unwind tables`, issue #21): each
//! mapped file's rows (`unwind_table.rs`) loaded once into UNWIND_ROWS and
//! shared by every process that maps the file, freed when none does; per
//! process, UNWIND_MAPPINGS tells the BPF walker which rows and which load
//! address apply to an address. `Modules` calls `sync` whenever it reads a
//! process's maps, and `drop_process` when they are gone.
//!
//! Whatever does not fit is counted, never cut: a table larger than the
//! free rows is not loaded at all (that file's frames take the
//! frame-pointer chain, `rows_full`), a mapping the trie has no room for is
//! left out (the walk hands that frame to user space, `mappings_full`).
//!
//! ```ignore
//! let mut tables = KernelTables::new(Box::new(bpf_maps));
//! tables.prepare(Path::new("/usr/bin/program")); // before it runs: built once
//! tables.sync(pid, &maps, &objects, |object| Some((file_id_of(object), path_of(object))));
//! tables.drop_process(pid);
//! ```

use std::{
    collections::{BTreeSet, HashMap},
    ops::Range,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use tracer_common::{MappingKey, MappingValue, MAPPING_FP_ONLY, MAPPING_TABLE};

use super::{
    cfi::{load_bias, load_segments},
    unwind_table::{UnwindTable, ROW_BYTES},
};
use crate::tracee::process::Mapping;

mod bpf;
mod extents;
#[cfg(test)]
mod tests;

pub use bpf::BpfUnwindMaps;
use extents::Extents;

/// What the manager needs of the BPF maps (a fake in the tests).
pub trait UnwindMaps {
    /// Rows UNWIND_ROWS holds.
    fn rows_capacity(&self) -> u32;
    fn write_rows(&mut self, first: u32, rows: &[u64]) -> anyhow::Result<()>;
    fn insert_mapping(&mut self, key: PrefixKey, value: MappingValue) -> anyhow::Result<()>;
    fn remove_mapping(&mut self, key: PrefixKey) -> anyhow::Result<()>;
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
    /// Files whose table did not fit in the free rows (frame-pointer
    /// chain there instead): raise --unwind-rows.
    pub rows_full: u64,
    /// Files without a usable table: no CFI, malformed or oversized CFI.
    pub table_errors: u64,
    /// Mappings UNWIND_MAPPINGS had no room for.
    pub mappings_full: u64,
    /// Rows the walker cannot follow (CFA from another register, ...), in
    /// the tables loaded: a stack through one ends there, counted.
    pub unsupported_rows: u64,
    /// Rows written, and the time spent building and writing tables.
    pub rows_written: u64,
    pub build_nanos: u64,
}

/// One file's table as loaded (or not).
struct FileTable {
    /// `(first row, rows, table base)`; None: frame-pointer chain only.
    rows: Option<(u32, u32, u64)>,
    /// PT_LOAD segments, for each mapping's load bias.
    loads: Vec<(Range<u64>, u64)>,
    /// Processes whose mappings use it.
    users: u32,
    /// Built ahead (`prepare`): kept while no process uses it yet.
    prepared: bool,
}

/// Which file: (device, inode), as `Modules` identifies objects.
pub type FileId = (u64, u64);

#[derive(Default)]
struct ProcEntries {
    entries: HashMap<PrefixKey, MappingValue>,
    /// The files they use, once each.
    objects: BTreeSet<FileId>,
}

pub struct KernelTables {
    maps: Box<dyn UnwindMaps>,
    /// One per file identity.
    files: HashMap<FileId, FileTable>,
    free: Extents,
    procs: HashMap<u32, ProcEntries>,
    pub stats: TableStats,
}

impl KernelTables {
    pub fn new(maps: Box<dyn UnwindMaps>) -> KernelTables {
        let capacity = maps.rows_capacity();
        KernelTables {
            maps,
            files: HashMap::new(),
            free: Extents::new(capacity),
            procs: HashMap::new(),
            stats: TableStats {
                rows_capacity: u64::from(capacity),
                ..TableStats::default()
            },
        }
    }

    /// Describes `pid`'s executable mappings to the walker: `maps` and
    /// `objects` as `Modules` holds them (same index), `open` gives an
    /// object's identity and a path to read it from (None: no table).
    /// `jit`: anonymous executable ranges, walked by frame pointers.
    pub fn sync(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        objects: &[u32],
        jit: &[Range<u64>],
        open: impl Fn(u32) -> Option<(FileId, PathBuf)>,
    ) {
        let mut want: HashMap<PrefixKey, MappingValue> = HashMap::new();
        for r in jit.iter().filter(|r| r.start < r.end) {
            for key in prefixes(pid, r.start, r.end) {
                want.insert(key, fp_only());
            }
        }
        let mut used = BTreeSet::new();
        for (m, &object) in maps.iter().zip(objects) {
            if !m.executable || m.start >= m.end {
                continue;
            }
            let value = match open(object) {
                Some((id, path)) => {
                    used.insert(id);
                    mapping_value(self.file(id, path), m)
                }
                None => mapping_value(&FileTable::none(Vec::new()), m),
            };
            for key in prefixes(pid, m.start, m.end) {
                want.insert(key, value);
            }
        }
        let old = self.procs.remove(&pid).unwrap_or_default();
        for (key, value) in &old.entries {
            if want.get(key) != Some(value) {
                let _ = self.maps.remove_mapping(*key);
            }
        }
        let mut entries = HashMap::with_capacity(want.len());
        for (key, value) in want {
            if old.entries.get(&key) != Some(&value)
                && self.maps.insert_mapping(key, value).is_err()
            {
                self.stats.mappings_full += 1;
                continue;
            }
            entries.insert(key, value);
        }
        for &object in &used {
            if let Some(f) = self.files.get_mut(&object) {
                f.users += 1;
            }
        }
        for object in old.objects {
            self.release(object);
        }
        // Tables built for this sync but used by no mapping in the end.
        let unused: Vec<FileId> = (self.files.iter())
            .filter(|(_, f)| f.users == 0 && !f.prepared)
            .map(|(&o, _)| o)
            .collect();
        for object in unused {
            self.free_file(object);
        }
        self.procs.insert(
            pid,
            ProcEntries {
                entries,
                objects: used,
            },
        );
    }

    /// The process exited or exec'ed: its mappings go, and the tables no
    /// other process uses.
    pub fn drop_process(&mut self, pid: u32) {
        let Some(old) = self.procs.remove(&pid) else {
            return;
        };
        for key in old.entries.keys() {
            let _ = self.maps.remove_mapping(*key);
        }
        for object in old.objects {
            self.release(object);
        }
    }

    /// Builds and loads the table of the file at `path` before any process
    /// maps it (a command about to start, the libraries it will load), so
    /// that its first allocations are walked in the kernel.
    pub fn prepare(&mut self, path: &Path) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        let id = (meta.dev(), meta.ino());
        if !self.files.contains_key(&id) {
            self.file(id, path.to_path_buf()).prepared = true;
        }
    }

    /// File `id`'s table, built and loaded the first time.
    fn file(&mut self, id: FileId, path: PathBuf) -> &mut FileTable {
        if !self.files.contains_key(&id) {
            let started = std::time::Instant::now();
            let table = self.load(Some(path));
            self.stats.build_nanos += started.elapsed().as_nanos() as u64;
            self.files.insert(id, table);
        }
        self.files.get_mut(&id).expect("inserted above")
    }

    /// Builds a file's table and writes it into a free extent of rows.
    fn load(&mut self, path: Option<PathBuf>) -> FileTable {
        let no_table = FileTable::none;
        let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else {
            self.stats.table_errors += 1;
            return no_table(Vec::new());
        };
        let loads = match object::File::parse(&*bytes) {
            Ok(file) => load_segments(&file),
            Err(_) => Vec::new(),
        };
        let built = UnwindTable::from_elf(&bytes).and_then(|t| {
            let unsupported: usize = t.stats.unsupported.iter().sum();
            Ok((t.base, t.encoded()?, unsupported))
        });
        let Ok((base, rows, unsupported)) = built else {
            self.stats.table_errors += 1;
            return no_table(loads);
        };
        let Some(first) = u32::try_from(rows.len())
            .ok()
            .and_then(|n| self.free.alloc(n))
        else {
            self.stats.rows_full += 1;
            return no_table(loads);
        };
        if self.maps.write_rows(first, &rows).is_err() {
            self.free.release(first, rows.len() as u32);
            self.stats.table_errors += 1;
            return no_table(loads);
        }
        self.stats.files += 1;
        self.stats.unsupported_rows += unsupported as u64;
        self.stats.rows_used += rows.len() as u64;
        self.stats.rows_written += rows.len() as u64;
        FileTable {
            rows: Some((first, rows.len() as u32, base)),
            loads,
            users: 0,
            prepared: false,
        }
    }

    /// One process less uses file `id`'s table: freed when none does.
    fn release(&mut self, id: FileId) {
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        f.users = f.users.saturating_sub(1);
        if f.users == 0 {
            self.free_file(id);
        }
    }

    fn free_file(&mut self, object: FileId) {
        if let Some(FileTable {
            rows: Some((first, n, _)),
            ..
        }) = self.files.remove(&object)
        {
            self.free.release(first, n);
            self.stats.files -= 1;
            self.stats.rows_used -= u64::from(n);
        }
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
        TablesInUse {
            files: self.stats.files,
            rows: self.stats.rows_used,
            mappings: self.procs.values().map(|p| p.entries.len() as u64).sum(),
            processes: self.procs.len() as u64,
        }
    }
}

/// The tables' footprint now: rows in UNWIND_ROWS (8 bytes each) for
/// `files` files, trie entries in UNWIND_MAPPINGS for `processes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablesInUse {
    pub files: u64,
    pub rows: u64,
    pub mappings: u64,
    pub processes: u64,
}

impl FileTable {
    /// A file without a table: its frames take the frame-pointer chain.
    fn none(loads: Vec<(Range<u64>, u64)>) -> FileTable {
        FileTable {
            rows: None,
            loads,
            users: 0,
            prepared: false,
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
