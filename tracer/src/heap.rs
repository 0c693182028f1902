//! The heap model: live allocations and per-stack totals, built from the
//! ALLOC/FREE event stream. Pure: no BPF, no I/O.

use std::collections::HashMap;

use crate::report::Counts;

/// Interned call stack (see `collector::StackTable`).
pub type StackHandle = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LiveBlock {
    stack: StackHandle,
    size: u64,
}

#[derive(Debug, Default)]
pub struct Heap {
    live: HashMap<(u32, u64), LiveBlock>,
    per_stack: HashMap<StackHandle, Counts>,
    /// FREE events for a block the model does not hold. BPF only sends FREE
    /// for blocks it recorded, so this stays 0 unless an ALLOC was lost.
    pub unmatched_frees: u64,
    /// ALLOC events for an address already live in the same process: the
    /// FREE in between was lost. The old block is dropped from in-use.
    pub replaced_allocs: u64,
}

impl Heap {
    pub fn alloc(&mut self, pid: u32, addr: u64, size: u64, stack: StackHandle) {
        if let Some(old) = self.live.insert((pid, addr), LiveBlock { stack, size }) {
            self.replaced_allocs += 1;
            self.release(old);
        }
        let c = self.per_stack.entry(stack).or_default();
        c.inuse_bytes += size;
        c.inuse_objects += 1;
        c.alloc_bytes += size;
        c.alloc_objects += 1;
    }

    pub fn free(&mut self, pid: u32, addr: u64) {
        match self.live.remove(&(pid, addr)) {
            Some(block) => self.release(block),
            None => self.unmatched_frees += 1,
        }
    }

    fn release(&mut self, block: LiveBlock) {
        if let Some(c) = self.per_stack.get_mut(&block.stack) {
            c.inuse_bytes -= block.size;
            c.inuse_objects -= 1;
        }
    }

    /// Per-stack totals, in no particular order.
    pub fn stacks(&self) -> impl Iterator<Item = (StackHandle, Counts)> + '_ {
        self.per_stack.iter().map(|(&h, &c)| (h, c))
    }

    #[cfg(test)]
    pub fn live_blocks(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        h.alloc(1, 0x1000, 100, 7);
        h.alloc(1, 0x2000, 50, 7);
        h.alloc(1, 0x3000, 8, 9);
        h.free(1, 0x2000);
        assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
        assert_eq!(counts(&h, 9), c(8, 1, 8, 1));
        assert_eq!(h.live_blocks(), 2);
    }

    #[test]
    fn given_a_realloc_chain_then_only_the_last_block_is_inuse() {
        // realloc in place and moving: BPF sends FREE(old) then ALLOC(new).
        let mut h = Heap::default();
        h.alloc(1, 0xa0, 100, 3);
        h.free(1, 0xa0);
        h.alloc(1, 0xa0, 200, 3); // grown in place
        h.free(1, 0xa0);
        h.alloc(1, 0xb0, 400, 3); // moved
        assert_eq!(counts(&h, 3), c(400, 1, 700, 3));
        assert_eq!(h.unmatched_frees, 0);
    }

    #[test]
    fn given_a_free_of_an_unknown_address_then_it_is_counted_and_ignored() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 10, 1);
        h.free(1, 0x999);
        h.free(2, 0x10); // same address, other process
        assert_eq!(h.unmatched_frees, 2);
        assert_eq!(counts(&h, 1), c(10, 1, 10, 1));
    }

    #[test]
    fn given_a_lost_free_then_the_reused_address_replaces_the_old_block() {
        let mut h = Heap::default();
        h.alloc(1, 0x10, 10, 1);
        h.alloc(1, 0x10, 20, 2);
        assert_eq!(h.replaced_allocs, 1);
        assert_eq!(counts(&h, 1), c(0, 0, 10, 1));
        assert_eq!(counts(&h, 2), c(20, 1, 20, 1));
    }

    #[test]
    fn given_churn_then_inuse_is_zero_and_alloc_counts_everything() {
        let mut h = Heap::default();
        for i in 0..1000u64 {
            h.alloc(1, 0x100 + (i % 3) * 16, 32, 4);
            h.free(1, 0x100 + (i % 3) * 16);
        }
        assert_eq!(counts(&h, 4), c(0, 0, 32_000, 1000));
    }
}
