//! The heap model: live allocations and per-stack totals, built from the
//! ALLOC/FREE event stream. Pure: no BPF, no I/O.

use std::collections::{HashMap, HashSet};

use crate::report::Counts;

/// Interned call stack (see `collect::stacks::StackTable`).
pub type StackHandle = u32;

/// One per live block: kept at 24 bytes (`born` fills what was padding
/// after `stack`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct LiveBlock {
    stack: StackHandle,
    /// When it was allocated, in `AGE_TICK_NS` ticks after `Heap::epoch_ns`
    /// rounded up (for --min-age): 32 bits of 10 ms last 497 days.
    born: u32,
    size: u64,
    /// Allocations this recorded one stands for (1 in exact mode).
    weight: f64,
}

/// Resolution of a live block's birth time: --min-age takes seconds.
pub const AGE_TICK_NS: u64 = 10_000_000;

/// How far before the first allocation seen the clock of birth times
/// starts: events of several CPUs reach user space slightly out of order,
/// and one a little older than the first must not be clamped to it.
const EPOCH_SLACK_NS: u64 = 1_000_000_000;

/// In-use bytes and objects of one stack, rounded like `Counts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InUse {
    pub bytes: u64,
    pub objects: u64,
}

/// Per-stack sums of weighted sizes and counts: exact integers in exact
/// mode, unbiased estimates when sampling.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Estimate {
    inuse_bytes: f64,
    inuse_objects: f64,
    alloc_bytes: f64,
    alloc_objects: f64,
    /// Left unfreed by processes that exited during the trace (see
    /// `Heap::exited`): no longer in use by anyone.
    exit_bytes: f64,
    exit_objects: f64,
    /// Processes that exited leaving blocks of this stack (summed when a
    /// folded process's stack joins its program's group stack).
    exit_processes: u64,
}

/// What processes that exited had not freed, for one stack: rounded like
/// `Counts`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unfreed {
    pub bytes: u64,
    pub objects: u64,
    /// How many exited processes left them.
    pub processes: u64,
}

impl Estimate {
    fn rounded(&self) -> Counts {
        // Removing blocks subtracts what adding them added, but in floating
        // point: clamp the rounding noise at zero.
        let r = |v: f64| v.max(0.0).round() as u64;
        Counts {
            inuse_bytes: r(self.inuse_bytes),
            inuse_objects: r(self.inuse_objects),
            alloc_bytes: r(self.alloc_bytes),
            alloc_objects: r(self.alloc_objects),
        }
    }

    fn unfreed(&self) -> Unfreed {
        let r = |v: f64| v.max(0.0).round() as u64;
        Unfreed {
            bytes: r(self.exit_bytes),
            objects: r(self.exit_objects),
            processes: self.exit_processes,
        }
    }
}

#[derive(Debug, Default)]
pub struct Heap {
    /// Live blocks by process, then address: what a process's exit or exec
    /// drops is found without looking at any other process's blocks.
    live: HashMap<u32, HashMap<u64, LiveBlock>>,
    /// Blocks the process whose exit ends the trace left (`exited` with
    /// `keep_inuse`): still in use, and --min-age needs their ages.
    kept_at_exit: Vec<LiveBlock>,
    /// Where birth times count from (bpf_ktime_get_ns clock): set at the
    /// first allocation, `EPOCH_SLACK_NS` before it.
    epoch_ns: Option<u64>,
    per_stack: HashMap<StackHandle, Estimate>,
    /// FREE events for a block the model does not hold. BPF only sends FREE
    /// for blocks it recorded, so this stays 0 unless an ALLOC was lost.
    pub unmatched_frees: u64,
    /// ALLOC events for an address already live in the same process: the
    /// FREE in between was lost. The old block is dropped from in-use.
    pub replaced_allocs: u64,
    /// Blocks of images replaced by exec, which BPF still holds in LIVE
    /// until the new image frees or reuses the address, or the process
    /// exits: such a FREE is expected, not unmatched.
    exec_dropped: HashMap<u32, HashSet<u64>>,
    /// Live blocks that exec made disappear.
    pub dropped_by_exec: u64,
    /// Blocks still live when their process exited; no longer tracked.
    pub live_at_exit: u64,
    /// Processes that exited with blocks moved out of in-use (see `exited`).
    pub exited_with_unfreed: u64,
}

impl Heap {
    /// A recorded allocation that stands for `weight` allocations of `size`,
    /// made at `at_ns` (bpf_ktime_get_ns, CLOCK_MONOTONIC).
    pub fn alloc(
        &mut self,
        pid: u32,
        addr: u64,
        size: u64,
        weight: f64,
        stack: StackHandle,
        at_ns: u64,
    ) {
        let block = LiveBlock {
            stack,
            born: self.tick(at_ns),
            size,
            weight,
        };
        if let Some(stale) = self.exec_dropped.get_mut(&pid) {
            stale.remove(&addr);
        }
        if let Some(old) = self.live.entry(pid).or_default().insert(addr, block) {
            self.replaced_allocs += 1;
            self.release(old);
        }
        let c = self.per_stack.entry(stack).or_default();
        let bytes = size as f64 * weight;
        c.inuse_bytes += bytes;
        c.inuse_objects += weight;
        c.alloc_bytes += bytes;
        c.alloc_objects += weight;
    }

    pub fn free(&mut self, pid: u32, addr: u64) {
        match self
            .live
            .get_mut(&pid)
            .and_then(|blocks| blocks.remove(&addr))
        {
            Some(block) => self.release(block),
            None if self
                .exec_dropped
                .get_mut(&pid)
                .is_some_and(|stale| stale.remove(&addr)) => {}
            None => self.unmatched_frees += 1,
        }
    }

    /// Process `pid` replaced its image (exec): its live blocks are gone.
    /// They stay in the allocation totals and leave the in-use ones.
    pub fn drop_process(&mut self, pid: u32) {
        let Some(blocks) = self.live.remove(&pid) else {
            return;
        };
        let stale = self.exec_dropped.entry(pid).or_default();
        for (addr, block) in blocks {
            stale.insert(addr);
            self.dropped_by_exec += 1;
            if let Some(c) = self.per_stack.get_mut(&block.stack) {
                c.inuse_bytes -= block.size as f64 * block.weight;
                c.inuse_objects -= block.weight;
            }
        }
    }

    /// Process `pid` exited. Its blocks are no longer tracked (a new
    /// process may reuse the pid and the addresses). What it had not freed
    /// stays in in-use when `keep_inuse` (the process whose exit ends the
    /// trace: in-use at the end is what it left), and otherwise moves to
    /// its stacks' "not freed at exit" (no live process holds it). Returns
    /// every address BPF may still hold in LIVE for it, for user space to
    /// delete.
    pub fn exited(&mut self, pid: u32, keep_inuse: bool) -> Vec<u64> {
        let mut addrs: Vec<u64> = self
            .exec_dropped
            .remove(&pid)
            .into_iter()
            .flatten()
            .collect();
        if let Some(blocks) = self.live.remove(&pid) {
            self.live_at_exit += blocks.len() as u64;
            if !keep_inuse && !blocks.is_empty() {
                self.exited_with_unfreed += 1;
            }
            addrs.reserve(blocks.len());
            let mut stacks = HashSet::new();
            for (addr, block) in blocks {
                addrs.push(addr);
                if keep_inuse {
                    self.kept_at_exit.push(block);
                    continue;
                }
                self.release(block);
                if let Some(c) = self.per_stack.get_mut(&block.stack) {
                    c.exit_bytes += block.size as f64 * block.weight;
                    c.exit_objects += block.weight;
                    if stacks.insert(block.stack) {
                        c.exit_processes += 1;
                    }
                }
            }
        }
        addrs
    }

    /// Stack `from` is summed into stack `into` (its process exited and
    /// was folded into its program's group): nothing live refers to it.
    pub fn merge(&mut self, from: StackHandle, into: StackHandle) {
        let Some(e) = self.per_stack.remove(&from) else {
            return;
        };
        let c = self.per_stack.entry(into).or_default();
        c.inuse_bytes += e.inuse_bytes;
        c.inuse_objects += e.inuse_objects;
        c.alloc_bytes += e.alloc_bytes;
        c.alloc_objects += e.alloc_objects;
        c.exit_bytes += e.exit_bytes;
        c.exit_objects += e.exit_objects;
        c.exit_processes += e.exit_processes;
    }

    fn release(&mut self, block: LiveBlock) {
        if let Some(c) = self.per_stack.get_mut(&block.stack) {
            c.inuse_bytes -= block.size as f64 * block.weight;
            c.inuse_objects -= block.weight;
        }
    }

    /// Per-stack totals, rounded, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = (StackHandle, Counts)> + '_ {
        self.per_stack.iter().map(|(&h, c)| (h, c.rounded()))
    }

    /// Per-stack "not freed at exit", for the stacks that have some.
    pub fn unfreed_at_exit(&self) -> impl Iterator<Item = (StackHandle, Unfreed)> + '_ {
        self.per_stack
            .iter()
            .filter(|(_, c)| c.exit_objects > 0.0)
            .map(|(&h, c)| (h, c.unfreed()))
    }

    /// `at_ns` as a birth tick, rounded up so that a block counts as old
    /// enough only when it is.
    fn tick(&mut self, at_ns: u64) -> u32 {
        let epoch = *self
            .epoch_ns
            .get_or_insert(at_ns.saturating_sub(EPOCH_SLACK_NS));
        let ticks = at_ns.saturating_sub(epoch).div_ceil(AGE_TICK_NS);
        u32::try_from(ticks).unwrap_or(u32::MAX)
    }

    /// In-use bytes and objects per stack of the blocks allocated at least
    /// `min_age_ns` before `now_ns` (the clock of `alloc`), weighted; the
    /// stacks without any are left out. Walks every live block: for reports,
    /// not per event.
    pub fn inuse_older_than(&self, now_ns: u64, min_age_ns: u64) -> HashMap<StackHandle, InUse> {
        let mut sums: HashMap<StackHandle, (f64, f64)> = HashMap::new();
        let old_enough = match (self.epoch_ns, now_ns.checked_sub(min_age_ns)) {
            // Ticks after the epoch, rounded down: born <= this is old enough.
            (Some(epoch), Some(cutoff)) if cutoff >= epoch => (cutoff - epoch) / AGE_TICK_NS,
            _ => return HashMap::new(),
        };
        let blocks = self.live.values().flat_map(HashMap::values);
        for block in blocks.chain(&self.kept_at_exit) {
            if u64::from(block.born) <= old_enough {
                let s = sums.entry(block.stack).or_default();
                s.0 += block.size as f64 * block.weight;
                s.1 += block.weight;
            }
        }
        sums.into_iter()
            .map(|(h, (bytes, objects))| {
                let r = |v: f64| v.max(0.0).round() as u64;
                (
                    h,
                    InUse {
                        bytes: r(bytes),
                        objects: r(objects),
                    },
                )
            })
            .collect()
    }

    /// Total in-use bytes now (estimated when sampling), for the progress
    /// line: one pass over the stacks.
    pub fn inuse_bytes(&self) -> u64 {
        let total: f64 = self.per_stack.values().map(|c| c.inuse_bytes).sum();
        total.max(0.0).round() as u64
    }

    /// Blocks tracked as live now, in every process.
    pub fn live_blocks(&self) -> usize {
        self.live.values().map(HashMap::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_drops_the_old_images_blocks_and_their_late_frees_match() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 0);
        h.alloc(1, 0x20, 50, 1.0, 7, 0);
        h.alloc(2, 0x10, 10, 1.0, 8, 0);
        h.drop_process(1);
        assert_eq!(h.dropped_by_exec, 2);
        let c = counts(&h, 7);
        assert_eq!((c.inuse_bytes, c.alloc_bytes), (0, 150));
        // BPF's stale entry for 0x10 is freed by the new image: expected.
        h.free(1, 0x10);
        // 0x20 is reused by a recorded allocation, then freed twice over.
        h.alloc(1, 0x20, 5, 1.0, 9, 0);
        h.free(1, 0x20);
        h.free(1, 0x20);
        assert_eq!(h.unmatched_frees, 1);
        assert_eq!(counts(&h, 8).inuse_bytes, 10);
    }

    #[test]
    fn given_the_exit_that_ends_the_trace_then_inuse_stays_and_the_pid_and_addresses_are_free() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 0);
        h.alloc(1, 0x20, 50, 1.0, 7, 0);
        h.free(1, 0x20);
        h.alloc(2, 0x10, 10, 1.0, 8, 0);
        h.drop_process(2); // exec: its block's LIVE entry is stale
        h.alloc(2, 0x30, 5, 1.0, 9, 0);
        let mut gone = h.exited(1, true);
        gone.sort_unstable();
        assert_eq!(gone, [0x10]);
        let mut gone = h.exited(2, true);
        gone.sort_unstable();
        assert_eq!(gone, [0x10, 0x30]);
        assert_eq!((h.live_at_exit, h.live_blocks()), (2, 0));
        // What each had not freed is still in use.
        assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
        assert_eq!(counts(&h, 9), c(5, 1, 5, 1));
        // A new process with pid 1 allocating at 0x10 replaces nothing.
        h.alloc(1, 0x10, 1, 1.0, 10, 0);
        assert_eq!(h.replaced_allocs, 0);
        assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
    }

    #[test]
    fn given_exits_folded_into_one_stack_then_it_counts_every_process_that_left_blocks() {
        let mut h = Heap::default();
        // Three processes leave blocks at their own stack 1, 2, 3; stack 4
        // is freed before its process exits.
        for pid in 1..=3u32 {
            h.alloc(pid, 0x10, 100, 1.0, pid, 0);
            h.alloc(pid, 0x20, 100, 1.0, pid, 0);
        }
        h.alloc(4, 0x10, 100, 1.0, 4, 0);
        h.free(4, 0x10);
        for pid in 1..=4 {
            h.exited(pid, false);
        }
        // Folded into the program's group stack 9, as --exited-processes does.
        for from in 1..=4 {
            h.merge(from, 9);
        }
        let at_exit: Vec<_> = h.unfreed_at_exit().collect();
        assert_eq!(
            at_exit,
            [(
                9,
                Unfreed {
                    bytes: 600,
                    objects: 6,
                    processes: 3,
                }
            )]
        );
        assert_eq!(h.exited_with_unfreed, 3);
    }

    #[test]
    fn given_an_exit_during_the_trace_then_what_was_not_freed_leaves_inuse_for_at_exit() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 0);
        h.alloc(1, 0x20, 50, 2.0, 7, 0);
        h.alloc(1, 0x30, 8, 1.0, 9, 0);
        h.free(1, 0x30);
        h.alloc(2, 0x10, 10, 1.0, 7, 0);
        let mut gone = h.exited(1, false);
        gone.sort_unstable();
        assert_eq!(gone, [0x10, 0x20]);
        assert_eq!(h.exited_with_unfreed, 1);
        // Process 2 still holds its block; process 1's moved out of in-use.
        assert_eq!(counts(&h, 7), c(10, 1, 210, 4));
        let at_exit: Vec<_> = h.unfreed_at_exit().collect();
        assert_eq!(
            at_exit,
            [(
                7,
                Unfreed {
                    bytes: 200,
                    objects: 3,
                    processes: 1,
                }
            )]
        );
        // A late free for a block of the exited process matches nothing.
        h.free(1, 0x10);
        assert_eq!(counts(&h, 7), c(10, 1, 210, 4));
        // An exit with nothing live adds no process.
        h.exited(3, false);
        assert_eq!(h.exited_with_unfreed, 1);
    }

    #[test]
    fn given_a_merge_then_the_numbers_move_and_the_old_stack_is_gone() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 0);
        h.alloc(1, 0x20, 50, 1.0, 7, 0);
        h.free(1, 0x20);
        h.exited(1, false);
        h.alloc(2, 0x10, 10, 1.0, 9, 0);
        h.free(2, 0x10);
        h.merge(7, 9);
        h.merge(3, 9); // unknown: nothing
        assert_eq!(h.stacks().count(), 1);
        assert_eq!(counts(&h, 9), c(0, 0, 160, 3));
        let at_exit: Vec<_> = h.unfreed_at_exit().collect();
        assert_eq!(
            at_exit,
            [(
                9,
                Unfreed {
                    bytes: 100,
                    objects: 1,
                    processes: 1,
                }
            )]
        );
    }

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn a_live_block_is_24_bytes() {
        assert_eq!(std::mem::size_of::<LiveBlock>(), 24);
    }

    #[test]
    fn given_blocks_of_several_ages_then_min_age_counts_only_the_old_ones_weighted() {
        // Boot clock at 1000 s; the trace's allocations at 1000, 1003, 1009 s.
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 1000 * SEC);
        h.alloc(1, 0x20, 50, 2.0, 7, 1003 * SEC);
        h.alloc(2, 0x30, 8, 1.0, 9, 1009 * SEC);
        h.alloc(1, 0x40, 1, 1.0, 9, 1000 * SEC);
        h.free(1, 0x40);
        let aged = |now: u64, min_age: u64| {
            let mut v: Vec<_> = h
                .inuse_older_than(now * SEC, min_age * SEC)
                .into_iter()
                .collect();
            v.sort_unstable_by_key(|(s, _)| *s);
            v
        };
        let inuse = |bytes, objects| InUse { bytes, objects };
        // At 1010 s: ages 10, 7 and 1 s.
        assert_eq!(aged(1010, 0), [(7, inuse(200, 3)), (9, inuse(8, 1))]);
        assert_eq!(aged(1010, 5), [(7, inuse(200, 3))]);
        assert_eq!(aged(1010, 7), [(7, inuse(200, 3))]);
        assert_eq!(aged(1010, 8), [(7, inuse(100, 1))]);
        assert_eq!(aged(1010, 11), []);
        // Older than the clock itself, or than the first allocation.
        assert_eq!(aged(5, 10), []);
        // Allocated counts and the unfiltered in-use are unchanged.
        assert_eq!(counts(&h, 7), c(200, 3, 200, 3));
        assert_eq!(h.inuse_bytes(), 208);
        // Ages are kept to 10 ms, rounded so that a block is never counted
        // before it is old enough.
        let mut h = Heap::default();
        h.alloc(1, 0x10, 5, 1.0, 1, 7 * SEC + 1);
        assert!(h.inuse_older_than(9 * SEC, 2 * SEC).is_empty());
        assert_eq!(h.inuse_older_than(9 * SEC + AGE_TICK_NS, 2 * SEC).len(), 1);
    }

    #[test]
    fn given_the_exit_that_ends_the_trace_then_min_age_still_sees_its_blocks() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 1.0, 7, 10 * SEC);
        h.alloc(1, 0x20, 30, 1.0, 8, 20 * SEC);
        h.alloc(2, 0x10, 40, 1.0, 7, 10 * SEC);
        h.exited(1, true);
        h.exited(2, false); // "not freed at exit": not in use at any age
        let aged = h.inuse_older_than(25 * SEC, 10 * SEC);
        assert_eq!(
            aged.into_iter().collect::<Vec<_>>(),
            [(
                7,
                InUse {
                    bytes: 100,
                    objects: 1
                }
            )]
        );
    }

    fn counts(h: &Heap, stack: StackHandle) -> Counts {
        h.stacks()
            .find(|(s, _)| *s == stack)
            .map(|(_, c)| c)
            .unwrap_or_default()
    }

    fn c(inuse_bytes: u64, inuse_objects: u64, alloc_bytes: u64, alloc_objects: u64) -> Counts {
        Counts {
            inuse_bytes,
            inuse_objects,
            alloc_bytes,
            alloc_objects,
        }
    }

    #[test]
    fn given_allocs_and_frees_then_inuse_is_what_remains() {
        let mut h = Heap::default();
        h.alloc(1, 0x1000, 100, 1.0, 7, 0);
        h.alloc(1, 0x2000, 50, 1.0, 7, 0);
        h.alloc(1, 0x3000, 8, 1.0, 9, 0);
        h.free(1, 0x2000);
        assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
        assert_eq!(counts(&h, 9), c(8, 1, 8, 1));
        assert_eq!(h.live_blocks(), 2);
    }

    #[test]
    fn given_a_realloc_chain_then_only_the_last_block_is_inuse() {
        // realloc in place and moving: BPF sends FREE(old) then ALLOC(new).
        let mut h = Heap::default();
        h.alloc(1, 0xa0, 100, 1.0, 3, 0);
        h.free(1, 0xa0);
        h.alloc(1, 0xa0, 200, 1.0, 3, 0); // grown in place
        h.free(1, 0xa0);
        h.alloc(1, 0xb0, 400, 1.0, 3, 0); // moved
        assert_eq!(counts(&h, 3), c(400, 1, 700, 3));
        assert_eq!(h.unmatched_frees, 0);
    }

    #[test]
    fn given_a_free_of_an_unknown_address_then_it_is_counted_and_ignored() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 10, 1.0, 1, 0);
        h.free(1, 0x999);
        h.free(2, 0x10); // same address, other process
        assert_eq!(h.unmatched_frees, 2);
        assert_eq!(counts(&h, 1), c(10, 1, 10, 1));
    }

    #[test]
    fn given_a_lost_free_then_the_reused_address_replaces_the_old_block() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 10, 1.0, 1, 0);
        h.alloc(1, 0x10, 20, 1.0, 2, 0);
        assert_eq!(h.replaced_allocs, 1);
        assert_eq!(counts(&h, 1), c(0, 0, 10, 1));
        assert_eq!(counts(&h, 2), c(20, 1, 20, 1));
    }

    #[test]
    fn given_weighted_samples_then_totals_are_weighted_and_frees_remove_them() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 100, 40.0, 5, 0);
        h.alloc(1, 0x20, 5000, 1.5, 5, 0);
        assert_eq!(counts(&h, 5), c(11_500, 42, 11_500, 42));
        h.free(1, 0x10);
        assert_eq!(counts(&h, 5), c(7_500, 2, 11_500, 42));
    }

    #[test]
    fn given_churn_then_inuse_is_zero_and_alloc_counts_everything() {
        let mut h = Heap::default();
        for i in 0..1000u64 {
            h.alloc(1, 0x100 + (i % 3) * 16, 32, 1.0, 4, 0);
            h.free(1, 0x100 + (i % 3) * 16);
        }
        assert_eq!(counts(&h, 4), c(0, 0, 32_000, 1000));
    }
}
