//! The heap's in-use numbers that walk its blocks or stacks: for reports
//! and the progress line, not per event.

use std::collections::HashMap;

use super::{Heap, InUse, StackHandle, AGE_TICK_NS};

impl Heap {
    /// In-use bytes and objects per stack of the blocks allocated at least
    /// `min_age_ns` before `now_ns` (the clock of `alloc`), weighted; the
    /// stacks without any are left out. Walks every live block: for reports,
    /// not per event.
    pub fn inuse_older_than(&self, now_ns: u64, min_age_ns: u64) -> HashMap<StackHandle, InUse> {
        match now_ns.checked_sub(min_age_ns) {
            Some(cutoff) => self.inuse_born_between(0, cutoff),
            None => HashMap::new(),
        }
    }

    /// In-use bytes and objects per stack of the blocks allocated from
    /// `from_ns` to `until_ns` (the clock of `alloc`), weighted; the stacks
    /// without any are left out. Birth times are kept to `AGE_TICK_NS`: a
    /// block allocated up to that much before `from_ns` may count. Walks
    /// every live block: for reports, not per event.
    pub fn inuse_born_between(&self, from_ns: u64, until_ns: u64) -> HashMap<StackHandle, InUse> {
        let mut sums: HashMap<StackHandle, (f64, f64)> = HashMap::new();
        let Some(epoch) = self.epoch_ns.filter(|&epoch| until_ns >= epoch) else {
            return HashMap::new();
        };
        // Ticks after the epoch, rounded down: born <= this is old enough.
        let old_enough = (until_ns - epoch) / AGE_TICK_NS;
        // Rounded up, as a birth is: born >= this is young enough.
        let young_enough = from_ns.saturating_sub(epoch).div_ceil(AGE_TICK_NS);
        let blocks = self.live.values().flat_map(HashMap::values);
        for block in blocks.chain(&self.kept_at_exit) {
            if (young_enough..=old_enough).contains(&u64::from(block.born)) {
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

    /// In-use bytes and objects of process `pid` now, weighted (walks its
    /// blocks: for an OOM victim's exit, not per event).
    pub fn inuse_of(&self, pid: u32) -> InUse {
        let (mut bytes, mut objects) = (0.0, 0.0);
        for block in self.live.get(&pid).into_iter().flat_map(HashMap::values) {
            bytes += block.size as f64 * block.weight;
            objects += block.weight;
        }
        let r = |v: f64| v.max(0.0).round() as u64;
        InUse {
            bytes: r(bytes),
            objects: r(objects),
        }
    }
}
