//! Each file's table in UNWIND_ROWS: built and loaded when a process
//! maps the file (or ahead of it), shared while processes use it, given
//! to `kept.rs` when its last user goes.

use std::{os::unix::fs::MetadataExt as _, path::Path, time::Instant};

use super::{
    kept::{Evictable, Stamp},
    FileId, FileTable, KernelTables,
};
use crate::stacks::unwind_table::{Loads, UnwindTable};

impl KernelTables {
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
    pub(super) fn acquire(&mut self, id: FileId, path: &Path, new_user: bool) {
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
    pub(super) fn release(&mut self, id: FileId) {
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
    pub(super) fn free_file(&mut self, object: FileId) -> bool {
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
