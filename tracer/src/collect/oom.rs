//! Processes the OOM killer chose (EventKind::OomKill, from `oom:mark_victim`):
//! when, and their heap when they died. A victim's exit is not an ordinary
//! one: what it held stays in use (it is what the memory went to) and its
//! process keeps its own entry (it is not folded into its program's group).
//!
//! Bounded: the first `MAX_KEPT` victims of a trace are kept this way;
//! later ones are counted (`seen`) and exit like any other process.

use crate::{collect::processes::ProcessIndex, model::heap::InUse};

/// Victims kept with their own entry and heap.
pub const MAX_KEPT: usize = 64;

/// One victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomVictim {
    pub pid: u32,
    /// The process's record (not folded while it is kept here).
    pub process: ProcessIndex,
    /// bpf_ktime_get_ns (CLOCK_MONOTONIC) when it was chosen.
    pub at_ns: u64,
    /// Its traced heap when its exit was handled; None while it runs.
    pub heap: Option<InUse>,
}

#[derive(Debug, Default)]
pub struct OomKills {
    /// Victims among the traced processes, kept or not.
    pub seen: u64,
    kept: Vec<OomVictim>,
}

impl OomKills {
    /// Process `pid` (record `process`) was chosen at `at_ns`. False when
    /// it is not kept (beyond `MAX_KEPT`, or already marked).
    pub fn mark(&mut self, pid: u32, process: ProcessIndex, at_ns: u64) -> bool {
        if self.kept.iter().any(|v| v.process == process) {
            return false;
        }
        self.seen += 1;
        if self.kept.len() >= MAX_KEPT {
            return false;
        }
        self.kept.push(OomVictim {
            pid,
            process,
            at_ns,
            heap: None,
        });
        true
    }

    /// The kept victim `pid` that has not exited yet, if any.
    pub fn dying(&mut self, pid: u32) -> Option<&mut OomVictim> {
        self.kept
            .iter_mut()
            .find(|v| v.pid == pid && v.heap.is_none())
    }

    pub fn victims(&self) -> &[OomVictim] {
        &self.kept
    }
}

/// Seconds into a trace of an event at `at_ns`, when `now_ns` is
/// `since_start_secs` after the trace started (both on the BPF clock,
/// CLOCK_MONOTONIC, which `Instant` reads too).
pub fn secs_into_trace(at_ns: u64, now_ns: u64, since_start_secs: f64) -> f64 {
    let ago = now_ns.saturating_sub(at_ns) as f64 / 1e9;
    (since_start_secs - ago).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_victim_is_kept_once_and_beyond_the_bound_only_counted() {
        let mut k = OomKills::default();
        assert!(k.mark(10, 1, 5));
        assert!(!k.mark(10, 1, 6), "marked once");
        assert_eq!(k.seen, 1);
        assert!(k.dying(10).is_some());
        k.dying(10).expect("dying").heap = Some(InUse {
            bytes: 8,
            objects: 1,
        });
        assert!(k.dying(10).is_none(), "exited");
        for i in 0..MAX_KEPT as u32 {
            k.mark(100 + i, 100 + i, 7);
        }
        assert_eq!(k.victims().len(), MAX_KEPT);
        assert_eq!(k.seen, 1 + MAX_KEPT as u64);
        assert_eq!(secs_into_trace(1_000_000_000, 3_000_000_000, 5.0), 3.0);
        assert_eq!(secs_into_trace(0, 9_000_000_000, 5.0), 0.0);
    }
}
