//! The heap model: live allocations and per-stack totals, built from the
//! ALLOC/FREE event stream. Pure: no BPF, no I/O.

use crate::hashing::{FastMap, FastSet};
use std::collections::HashSet;

use crate::{
    model::{
        peak::{self, ProcessPeak, StackPeak},
        peak_trigger::PeakTrigger,
    },
    report::Counts,
};

/// Interned call stack (see `collect::stack_table::StackTable`).
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
    /// What it held at its process's peak (see `model::peak`).
    peak: StackPeak,
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
            // Needs the stack's process: `Heap::stack_peak`.
            peak_inuse_bytes: 0,
            peak_inuse_objects: 0,
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
    live: FastMap<u32, FastMap<u64, LiveBlock>>,
    /// Blocks in `live`, all processes (exact mode bounds it by --max-live).
    blocks: usize,
    /// Blocks the process whose exit ends the trace left (`exited` with
    /// `keep_inuse`): still in use, and --min-age needs their ages.
    kept_at_exit: Vec<LiveBlock>,
    /// Where birth times count from (bpf_ktime_get_ns clock): set at the
    /// first allocation, `EPOCH_SLACK_NS` before it.
    epoch_ns: Option<u64>,
    per_stack: FastMap<StackHandle, Estimate>,
    /// In-use totals and peak of each process with blocks or stacks here,
    /// by pid: taken out at its exit (`take_peak`).
    peaks: FastMap<u32, ProcessPeak>,
    /// --snapshot-on-peak: the bytes in use across the trace, and whether
    /// they rose past the last snapshot's by enough for another.
    pub peak_trigger: Option<PeakTrigger>,
    /// ALLOC events for an address already live in the same process: the
    /// FREE in between was lost. The old block is dropped from in-use.
    pub replaced_allocs: u64,
    /// Blocks of images replaced by exec, which BPF still holds in LIVE
    /// until the new image frees or reuses the address, or the process
    /// exits: such a FREE is expected, not unmatched.
    exec_dropped: FastMap<u32, FastSet<u64>>,
    /// Live blocks that exec made disappear.
    pub dropped_by_exec: u64,
    /// Blocks still live when their process exited; no longer tracked.
    pub live_at_exit: u64,
    /// Processes that exited with blocks moved out of in-use (see `exited`).
    pub exited_with_unfreed: u64,
}

impl Heap {
    /// An empty heap; `peak_trigger`: --snapshot-on-peak's.
    pub fn new(peak_trigger: Option<PeakTrigger>) -> Heap {
        Heap {
            peak_trigger,
            ..Heap::default()
        }
    }

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
        match self.live.entry(pid).or_default().insert(addr, block) {
            Some(old) => {
                self.replaced_allocs += 1;
                release(
                    &mut self.per_stack,
                    &mut self.peaks,
                    pid,
                    old,
                    &mut self.peak_trigger,
                );
            }
            None => self.blocks += 1,
        }
        let c = self.per_stack.entry(stack).or_default();
        let bytes = size as f64 * weight;
        let process = self.peaks.entry(pid).or_default();
        c.peak
            .before_change(process, c.inuse_bytes, c.inuse_objects);
        c.inuse_bytes += bytes;
        c.inuse_objects += weight;
        c.alloc_bytes += bytes;
        c.alloc_objects += weight;
        process.changed(bytes, weight, at_ns);
        if let Some(trigger) = &mut self.peak_trigger {
            trigger.changed(bytes);
        }
    }

    /// A FREE of `addr`: false when the model has no such block (nor one
    /// that exec dropped), which the caller counts.
    pub fn free(&mut self, pid: u32, addr: u64) -> bool {
        match self
            .live
            .get_mut(&pid)
            .and_then(|blocks| blocks.remove(&addr))
        {
            Some(block) => {
                self.blocks -= 1;
                release(
                    &mut self.per_stack,
                    &mut self.peaks,
                    pid,
                    block,
                    &mut self.peak_trigger,
                );
                true
            }
            None => self
                .exec_dropped
                .get_mut(&pid)
                .is_some_and(|stale| stale.remove(&addr)),
        }
    }

    /// Whether `addr` is a live block of process `pid`.
    pub fn is_live(&self, pid: u32, addr: u64) -> bool {
        self.live
            .get(&pid)
            .is_some_and(|blocks| blocks.contains_key(&addr))
    }

    /// Process `pid` replaced its image (exec): its live blocks are gone.
    /// They stay in the allocation totals and leave the in-use ones.
    pub fn drop_process(&mut self, pid: u32) {
        let Some(blocks) = self.live.remove(&pid) else {
            return;
        };
        self.blocks -= blocks.len();
        let stale = self.exec_dropped.entry(pid).or_default();
        for (addr, block) in blocks {
            stale.insert(addr);
            self.dropped_by_exec += 1;
            release(
                &mut self.per_stack,
                &mut self.peaks,
                pid,
                block,
                &mut self.peak_trigger,
            );
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
            self.blocks -= blocks.len();
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
                release(
                    &mut self.per_stack,
                    &mut self.peaks,
                    pid,
                    block,
                    &mut self.peak_trigger,
                );
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
    /// `process`: the peak of `from`'s process (see `take_peak`).
    pub fn merge(&mut self, from: StackHandle, into: StackHandle, process: Option<&ProcessPeak>) {
        let Some(e) = self.per_stack.remove(&from) else {
            return;
        };
        let c = self.per_stack.entry(into).or_default();
        c.peak
            .add_folded(e.peak.at_peak(process, e.inuse_bytes, e.inuse_objects));
        c.inuse_bytes += e.inuse_bytes;
        c.inuse_objects += e.inuse_objects;
        c.alloc_bytes += e.alloc_bytes;
        c.alloc_objects += e.alloc_objects;
        c.exit_bytes += e.exit_bytes;
        c.exit_objects += e.exit_objects;
        c.exit_processes += e.exit_processes;
    }

    /// Process `pid` exited: its peak, which no later event changes,
    /// leaves the model (a new process may reuse the pid).
    pub fn take_peak(&mut self, pid: u32) -> Option<ProcessPeak> {
        self.peaks.remove(&pid)
    }

    /// The peak of running process `pid`.
    pub fn peak(&self, pid: u32) -> Option<&ProcessPeak> {
        self.peaks.get(&pid)
    }

    /// What stack `h` held at the peak of its process (`process`), rounded.
    pub fn stack_peak(&self, h: StackHandle, process: Option<&ProcessPeak>) -> InUse {
        let Some(c) = self.per_stack.get(&h) else {
            return InUse::default();
        };
        let (bytes, objects) = c.peak.at_peak(process, c.inuse_bytes, c.inuse_objects);
        InUse {
            bytes: peak::round(bytes),
            objects: peak::round(objects),
        }
    }

    /// Stacks with numbers (what `stacks` yields).
    pub fn stack_count(&self) -> usize {
        self.per_stack.len()
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

    /// Blocks tracked as live now, in every process.
    pub fn live_blocks(&self) -> usize {
        self.blocks
    }
}

/// `block` of process `pid` leaves in-use: its stack saves what it held
/// at the process's peak first (a free function: callers hold other
/// fields of the heap).
fn release(
    per_stack: &mut FastMap<StackHandle, Estimate>,
    peaks: &mut FastMap<u32, ProcessPeak>,
    pid: u32,
    block: LiveBlock,
    trigger: &mut Option<PeakTrigger>,
) {
    let Some(c) = per_stack.get_mut(&block.stack) else {
        return;
    };
    let (bytes, objects) = (block.size as f64 * block.weight, block.weight);
    if let Some(process) = peaks.get_mut(&pid) {
        c.peak
            .before_change(process, c.inuse_bytes, c.inuse_objects);
        process.changed(-bytes, -objects, 0);
    }
    c.inuse_bytes -= bytes;
    c.inuse_objects -= objects;
    if let Some(trigger) = trigger {
        trigger.changed(-bytes);
    }
}

mod inuse;
#[cfg(test)]
mod tests;
