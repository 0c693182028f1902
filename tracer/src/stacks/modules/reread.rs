//! When a process's /proc/PID/maps is read again. Every event at an
//! address the maps as read do not cover (a library loaded since, JIT
//! code) and every kernel walk that ended early asks for a read; this
//! decides which of them get one, so that a process whose code no read
//! explains costs no read per event.
//!
//! Held per process: two stamps and at most MAX_ENDED_AT addresses.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

/// Else each event at an address in no mapped file (JIT code) re-reads maps.
pub const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(100);

/// The same for the read at once after a kernel walk first ended at an
/// address (`after_walk_end`): else a process whose walks end at ever new
/// addresses costs a read, a merge and a kernel sync per event.
pub const MIN_WALK_REREAD_INTERVAL: Duration = Duration::from_millis(10);

/// A new process maps its libraries in its first milliseconds, so reads
/// soon after its exec must not block the next few: this many are free of
/// the interval (a short-lived process is gone 100 ms later).
pub const QUICK_READS: u32 = 8;

/// Addresses kept per process where kernel walks ended early.
const MAX_ENDED_AT: usize = 4096;

/// One process's reads so far.
#[derive(Clone, Debug, Default)]
pub struct ReadPolicy {
    last_read: Option<Instant>,
    /// Reads inside the interval so far (see `may_read`).
    quick_reads: u32,
    /// Addresses where a kernel walk ended early under the maps as last
    /// read; cleared when the executable maps change.
    ended_at: HashSet<u64>,
}

impl ReadPolicy {
    /// A process whose maps were read (or taken from its parent) at `now`.
    pub fn read_at(now: Instant) -> ReadPolicy {
        ReadPolicy {
            last_read: Some(now),
            ..ReadPolicy::default()
        }
    }

    /// Whether the maps may be read at `now`: not within `min_interval`
    /// of the last read, but for the first QUICK_READS (counted here).
    pub fn may_read(&mut self, now: Instant, min_interval: Duration) -> bool {
        let recent = self
            .last_read
            .is_some_and(|t| now.saturating_duration_since(t) < min_interval);
        if recent {
            if self.quick_reads >= QUICK_READS {
                return false;
            }
            self.quick_reads += 1;
        }
        true
    }

    /// The maps were read at `now`.
    pub fn read(&mut self, now: Instant) {
        self.last_read = Some(now);
    }

    /// The maps could not be read at `now` (the process is gone): no retry
    /// within the interval, quick reads or not.
    pub fn unread(&mut self, now: Instant) {
        self.last_read = Some(now);
        self.quick_reads = QUICK_READS;
    }

    /// The process exec'ed: its new image is read as a new process's.
    pub fn exec(&mut self) {
        *self = ReadPolicy::default();
    }

    /// The executable maps changed: where walks ended means nothing now
    /// (walks end in code only: data mapped or unmapped changes none).
    pub fn code_changed(&mut self) {
        self.ended_at.clear();
    }

    /// A kernel walk ended early at `pc` at `now` (a frame it could not
    /// follow: maybe the table of a library unloaded since, with another
    /// loaded at its addresses). Whether to read the maps: the first time
    /// a walk ends at `pc` under the maps as last read, at most every
    /// MIN_WALK_REREAD_INTERVAL (one refused leaves `pc` a first end
    /// still); later times, as any other read.
    pub fn after_walk_end(&mut self, pc: u64, now: Instant) -> bool {
        let first = self.ended_at.len() < MAX_ENDED_AT && self.ended_at.insert(pc);
        if !first {
            return self.may_read(now, MIN_REREAD_INTERVAL);
        }
        let read = self.may_read(now, MIN_WALK_REREAD_INTERVAL);
        if !read {
            self.ended_at.remove(&pc);
        }
        read
    }

    /// How many addresses where walks ended are kept.
    #[cfg(test)]
    pub fn walk_ends(&self) -> usize {
        self.ended_at.len()
    }
}

#[cfg(test)]
mod tests;
