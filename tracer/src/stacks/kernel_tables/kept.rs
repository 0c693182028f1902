//! Tables of files no process maps any more: kept loaded (rows in
//! UNWIND_ROWS, entry in `files`) for the next process that maps the file,
//! and let go oldest-unused first when a new table needs their rows, when
//! more than MAX_UNUSED_FILES are kept, or after UNUSED_TABLE_TTL unused.
//!
//! What bounds them: their rows are part of UNWIND_ROWS's fixed capacity
//! (`--unwind-rows`), which a kept table never takes from a table in use
//! (it is evicted first); their entries are at most MAX_UNUSED_FILES
//! (a few hundred bytes each in user space: the PT_LOAD list and the
//! counters).

use std::{
    fs::Metadata,
    os::unix::fs::MetadataExt as _,
    time::{Duration, Instant},
};

use super::{FileId, KernelTables};

/// How long a table no process uses stays loaded. Longer than the parsed
/// files' UNUSED_FILE_TTL (10 s, `cfi.rs`): those cost the tracer memory,
/// while a kept table's rows are in the map whose size is fixed at start
/// (kept or not, the same memory) and are given up as soon as a new table
/// needs them; what it saves is a build (up to seconds of CPU for a
/// compiler's libraries). Five minutes covers programs run every minute or
/// few (cron jobs, health checks, build steps) and still lets the tables
/// of programs a host stopped running (deleted, upgraded) go in minutes.
pub const UNUSED_TABLE_TTL: Duration = Duration::from_secs(300);

/// Files no process uses whose entries are kept at most (with or without
/// a table): past it the oldest go.
pub(super) const MAX_UNUSED_FILES: usize = 1024;

/// The file as it was when its table was built: size, modification and
/// change times. A kept table is reused only for an unchanged file (a
/// deleted file's inode number can be given to a new file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    pub(super) fn of(meta: &Metadata) -> Stamp {
        Stamp {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// When a table's last user let go, and the order of that (oldest first).
#[derive(Clone, Copy, Debug)]
pub(super) struct Idle {
    since: Instant,
    order: u64,
}

impl KernelTables {
    /// File `id`'s table is used by no process from now on.
    pub(super) fn set_idle(&mut self, id: FileId) {
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        if f.idle.is_none() {
            self.idle_files += 1;
        }
        self.idle_seq += 1;
        f.idle = Some(Idle {
            since: Instant::now(),
            order: self.idle_seq,
        });
        while self.idle_files > MAX_UNUSED_FILES && self.evict_oldest(false) {}
    }

    /// Whether `n` rows could be had: free now, or held by unused tables.
    pub(super) fn could_fit(&self, n: u32) -> bool {
        let unused: u64 = (self.files.values())
            .filter(|f| f.idle.is_some())
            .filter_map(|f| f.rows.map(|(_, rows, _)| u64::from(rows)))
            .sum();
        self.free.total() + unused >= u64::from(n)
    }

    /// `n` free rows, evicting unused tables (oldest first) until they are
    /// free; None when they cannot be had.
    pub(super) fn alloc_rows(&mut self, n: u32) -> Option<u32> {
        loop {
            if let Some(first) = self.free.alloc(n) {
                return Some(first);
            }
            if !self.could_fit(n) || !self.evict_oldest(true) {
                return None;
            }
        }
    }

    /// Drops the unused entry released first (only one with rows when
    /// `with_rows`); false when there is none.
    fn evict_oldest(&mut self, with_rows: bool) -> bool {
        let oldest = (self.files.iter())
            .filter(|(_, f)| !with_rows || f.rows.is_some_and(|(_, n, _)| n > 0))
            .filter_map(|(&id, f)| Some((f.idle?.order, id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        self.free_file(id);
        self.stats.evicted += 1;
        true
    }

    /// Drops the tables no process used for UNUSED_TABLE_TTL before `now`
    /// (called about every second, and by the tests with a later `now`).
    pub fn expire_unused(&mut self, now: Instant) {
        let expired: Vec<FileId> = (self.files.iter())
            .filter(|(_, f)| {
                f.idle
                    .is_some_and(|i| now.saturating_duration_since(i.since) >= UNUSED_TABLE_TTL)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            self.free_file(id);
            self.stats.expired += 1;
        }
    }
}
