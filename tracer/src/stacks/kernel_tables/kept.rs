//! Tables of files no process maps any more: kept loaded (rows in
//! UNWIND_ROWS, entry in `files`) for the next process that maps the file,
//! and let go oldest-unused first when a new table needs their rows, when
//! more than MAX_UNUSED_FILES are kept, or after UNUSED_TABLE_TTL unused.
//!
//! Against thrash: a kept table used in the last RECENTLY_USED is not
//! evicted for a new one's rows (the new one then does not fit, counted),
//! and a table evicted or that did not fit leaves a stub (no rows, the
//! rows it needs): the file is not built again until that many rows can
//! be had. Without both, a host whose programs' tables exceed the rows
//! evicts one program's table for the next and rebuilds it at its next
//! run, over and over (docs/soak-tables.md: 27,468 builds, 445 s of CPU
//! in 600 s).
//!
//! What bounds them: their rows are part of UNWIND_ROWS's fixed capacity
//! (`--unwind-rows`), which a kept table never takes from a table in use
//! (it is evicted first); their entries, stubs included, are at most
//! MAX_UNUSED_FILES (a few hundred bytes each in user space: the PT_LOAD
//! list and the counters) and go after UNUSED_TABLE_TTL.

use std::{
    collections::BTreeSet,
    fs::Metadata,
    os::unix::fs::MetadataExt as _,
    time::{Duration, Instant},
};

use super::{FileId, FileTable, KernelTables};

/// How long a table no process uses stays loaded. Longer than the parsed
/// files' UNUSED_FILE_TTL (10 s, `cfi.rs`): those cost the tracer memory,
/// while a kept table's rows are in the map whose size is fixed at start
/// (kept or not, the same memory) and are given up as soon as a new table
/// needs them; what it saves is a build (up to seconds of CPU for a
/// compiler's libraries). Five minutes covers programs run every minute or
/// few (cron jobs, health checks, build steps) and still lets the tables
/// of programs a host stopped running (deleted, upgraded) go in minutes.
pub const UNUSED_TABLE_TTL: Duration = Duration::from_secs(300);

/// A kept table whose last process left less than this long ago is not
/// evicted for a new table's rows: a program run again within seconds (a
/// shell loop, a build's compiler runs) is the host's working set, and
/// evicting it for another program's table only to build it again at its
/// next run is the thrash. Short against UNUSED_TABLE_TTL, so that the
/// tables of programs run a while ago still give way; a table kept out by
/// it is loaded late, once the rows can be had (`waiting`).
pub const RECENTLY_USED: Duration = Duration::from_secs(10);

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

/// Which kept tables may give their rows to a new table.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Evictable {
    /// Those unused for RECENTLY_USED or longer: the policy.
    Idle,
    /// Every unused one: what would fit without the policy (to count a
    /// table kept out by it).
    AnyUnused,
}

impl KernelTables {
    /// File `id`'s table is used by no process from now on.
    pub(super) fn set_idle(&mut self, id: FileId) {
        let since = (self.clock)();
        let Some(f) = self.files.get_mut(&id) else {
            return;
        };
        if f.idle.is_none() {
            self.idle_files += 1;
        }
        self.idle_seq += 1;
        f.idle = Some(Idle {
            since,
            order: self.idle_seq,
        });
        while self.idle_files > MAX_UNUSED_FILES && self.drop_oldest_unused() {}
    }

    /// Whether `n` contiguous rows could be had now: free, or once the
    /// tables `which` allows are evicted (first fit needs one extent: a
    /// sum of scattered rows would promise a build that then cannot load).
    pub(super) fn could_fit(&self, n: u32, now: Instant, which: Evictable) -> bool {
        let evictable = (self.files.values())
            .filter(|f| f.evictable(now, which))
            .filter_map(|f| f.rows.map(|(first, rows, _)| (first, rows)));
        let mut spans: Vec<(u32, u32)> = self.free.spans().chain(evictable).collect();
        spans.sort_unstable();
        let mut largest = 0u64;
        let mut run: Option<(u64, u64)> = None;
        for (start, len) in spans {
            let (start, len) = (u64::from(start), u64::from(len));
            run = match run {
                Some((s, l)) if s + l == start => Some((s, l + len)),
                _ => Some((start, len)),
            };
            largest = largest.max(run.map_or(0, |(_, l)| l));
        }
        largest >= u64::from(n)
    }

    /// `n` free rows, evicting kept tables unused for RECENTLY_USED
    /// (oldest first) until they are free; None when they cannot be had.
    pub(super) fn alloc_rows(&mut self, n: u32, now: Instant) -> Option<u32> {
        loop {
            if let Some(first) = self.free.alloc(n) {
                return Some(first);
            }
            if !self.could_fit(n, now, Evictable::Idle) || !self.evict_for_rows(now) {
                return None;
            }
        }
    }

    /// Frees the rows of the oldest evictable kept table, leaving a stub
    /// that remembers how many it needs; false when there is none.
    fn evict_for_rows(&mut self, now: Instant) -> bool {
        let oldest = (self.files.iter())
            .filter(|(_, f)| f.rows.is_some() && f.evictable(now, Evictable::Idle))
            .filter_map(|(&id, f)| Some((f.idle?.order, id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        let Some(f) = self.files.get_mut(&id) else {
            return false;
        };
        if let Some((first, n, _)) = f.rows.take() {
            f.needed = n;
            self.free.release(first, n);
            self.stats.files -= 1;
            self.stats.rows_used -= u64::from(n);
        }
        self.stats.evicted += 1;
        true
    }

    /// Drops the unused entry released first (a table or a stub) for
    /// MAX_UNUSED_FILES; false when there is none.
    fn drop_oldest_unused(&mut self) -> bool {
        let oldest = (self.files.iter())
            .filter_map(|(&id, f)| Some((f.idle?.order, id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        if self.free_file(id) {
            self.stats.evicted += 1;
        }
        true
    }

    /// Drops the entries no process used for UNUSED_TABLE_TTL before `now`
    /// (called about every second, and by the tests with a later `now`).
    pub fn expire_unused(&mut self, now: Instant) {
        let expired: Vec<FileId> = (self.files.iter())
            .filter(|(_, f)| f.idle.is_some_and(|i| idle_for(i, now) >= UNUSED_TABLE_TTL))
            .map(|(&id, _)| id)
            .collect();
        for id in expired {
            if self.free_file(id) {
                self.stats.expired += 1;
            }
        }
    }

    /// Processes using a file that has no table for lack of rows, where
    /// the rows can be had now (RECENTLY_USED passed, tables freed): the
    /// caller describes them again (`sync`), which loads the table. Else
    /// a long-lived process that started next to a burst of short ones
    /// would walk by frame pointers for its whole life.
    pub fn waiting(&self, now: Instant) -> Vec<u32> {
        let ready: BTreeSet<FileId> = (self.files.iter())
            .filter(|(_, f)| f.users > 0 && f.rows.is_none() && f.needed > 0)
            .filter(|(_, f)| self.could_fit(f.needed, now, Evictable::Idle))
            .map(|(&id, _)| id)
            .collect();
        if ready.is_empty() {
            return Vec::new();
        }
        let mut pids: Vec<u32> = (self.procs.iter())
            .filter(|(_, p)| !p.objects.is_disjoint(&ready))
            .map(|(&pid, _)| pid)
            .collect();
        pids.sort_unstable();
        pids
    }
}

impl FileTable {
    /// Whether its rows may go to a new table.
    fn evictable(&self, now: Instant, which: Evictable) -> bool {
        self.idle.is_some_and(|i| match which {
            Evictable::Idle => idle_for(i, now) >= RECENTLY_USED,
            Evictable::AnyUnused => true,
        })
    }
}

fn idle_for(idle: Idle, now: Instant) -> Duration {
    now.saturating_duration_since(idle.since)
}
