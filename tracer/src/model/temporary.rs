//! Temporary allocations (heaptrack's definition): a block freed by the
//! thread that allocated it before that thread allocates again. Counted
//! per stack, in exact mode only: with sampling most allocations are not
//! seen, so "before its next allocation" cannot be told.
//!
//! Per thread, only its newest recorded block is remembered. The state is
//! bounded by the threads that allocated, at most `MAX_THREADS` (beyond it
//! a new thread's blocks are not candidates, counted in `untracked`); an
//! entry goes when its block is freed (by any thread), when its thread
//! allocates again (replaced), and when its process exits or execs. A
//! thread that exits leaves its entry until then, or until its block is
//! freed or its thread id is reused.
//!
//! What counts: a `free` (or `delete`), not the release of the old block
//! by realloc, whose contents live on in the new one (heaptrack counts a
//! realloc of the newest block as temporary).
//!
//! Pure: no BPF, no I/O.

use crate::hashing::FastMap;

use super::heap::StackHandle;
use crate::profile::Temporary;

/// Threads whose newest block is remembered at once.
pub const MAX_THREADS: usize = 1 << 16;

/// A thread's newest recorded block.
#[derive(Clone, Copy, Debug)]
struct Newest {
    addr: u64,
    size: u64,
    stack: StackHandle,
}

#[derive(Debug, Default)]
pub struct Temporaries {
    /// By process, then thread: each thread's newest block.
    newest: FastMap<u32, FastMap<u32, Newest>>,
    /// Which thread's newest block each (process, address) is.
    owner: FastMap<(u32, u64), u32>,
    /// Threads remembered now (the sum of `newest`'s inner lengths).
    threads: usize,
    per_stack: FastMap<StackHandle, Temporary>,
    /// Allocations not considered: their thread would have exceeded
    /// `MAX_THREADS`.
    pub untracked: u64,
}

impl Temporaries {
    /// Thread `tid` of `pid` allocated `size` bytes at `addr` from `stack`.
    ///
    /// On every recorded allocation in exact mode: four hash operations in
    /// the usual case (the thread's slot, its previous block's and the new
    /// block's owner entries), the others only when a free was lost.
    pub fn alloc(&mut self, pid: u32, tid: u32, addr: u64, size: u64, stack: StackHandle) {
        let new = Newest { addr, size, stack };
        let full = self.threads >= MAX_THREADS;
        let threads = self.newest.entry(pid).or_default();
        match threads.get_mut(&tid) {
            Some(slot) => {
                let prev = std::mem::replace(slot, new);
                self.owner.remove(&(pid, prev.addr));
            }
            None if full => {
                if threads.is_empty() {
                    self.newest.remove(&pid);
                }
                self.untracked += 1;
                // The address may still be another thread's newest (its
                // free was lost): that block is gone.
                if let Some(old) = self.owner.remove(&(pid, addr)) {
                    self.forget_thread(pid, old);
                }
                return;
            }
            None => {
                threads.insert(tid, new);
                self.threads += 1;
            }
        }
        // An address still another thread's newest (its free was lost):
        // that block is gone.
        if let Some(old) = self.owner.insert((pid, addr), tid) {
            if old != tid {
                self.forget_thread(pid, old);
            }
        }
    }

    /// Thread `tid` of `pid` freed `addr`; `by_free` is false when realloc
    /// released it (not a temporary, see the module documentation).
    pub fn free(&mut self, pid: u32, tid: u32, addr: u64, by_free: bool) {
        let Some(owner) = self.owner.remove(&(pid, addr)) else {
            return;
        };
        let Some(newest) = self.forget_thread(pid, owner) else {
            return;
        };
        if owner == tid && by_free {
            self.per_stack
                .entry(newest.stack)
                .or_default()
                .add(Temporary {
                    objects: 1,
                    bytes: newest.size,
                });
        }
    }

    fn forget_thread(&mut self, pid: u32, tid: u32) -> Option<Newest> {
        let threads = self.newest.get_mut(&pid)?;
        let newest = threads.remove(&tid)?;
        self.threads -= 1;
        if threads.is_empty() {
            self.newest.remove(&pid);
        }
        Some(newest)
    }

    /// Process `pid` exited or exec'ed: its threads' entries go.
    pub fn forget_process(&mut self, pid: u32) {
        let Some(threads) = self.newest.remove(&pid) else {
            return;
        };
        self.threads -= threads.len();
        for newest in threads.values() {
            self.owner.remove(&(pid, newest.addr));
        }
    }

    /// Stack `from` is summed into `into` (see `Heap::merge`).
    pub fn merge(&mut self, from: StackHandle, into: StackHandle) {
        if let Some(c) = self.per_stack.remove(&from) {
            self.per_stack.entry(into).or_default().add(c);
        }
    }

    /// The temporaries of `stack` (zero when it has none).
    pub fn of(&self, stack: StackHandle) -> Temporary {
        self.per_stack.get(&stack).copied().unwrap_or_default()
    }

    /// Threads remembered now.
    pub fn threads(&self) -> usize {
        self.threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PID: u32 = 7;

    #[test]
    fn freed_by_its_thread_before_its_next_allocation_is_temporary() {
        let mut t = Temporaries::default();
        // Given a loop of malloc/free pairs on thread 1.
        for _ in 0..5 {
            t.alloc(PID, 1, 0x10, 32, 100);
            t.free(PID, 1, 0x10, true);
        }
        // Then each pair is one temporary.
        assert_eq!(
            t.of(100),
            Temporary {
                objects: 5,
                bytes: 160
            }
        );
        assert_eq!(t.threads(), 0, "nothing left to remember");
    }

    #[test]
    fn freed_after_another_allocation_or_by_another_thread_is_not() {
        let mut t = Temporaries::default();
        // Freed after the thread's next allocation.
        t.alloc(PID, 1, 0x10, 8, 100);
        t.alloc(PID, 1, 0x20, 8, 200);
        t.free(PID, 1, 0x10, true);
        // Freed by another thread.
        t.alloc(PID, 2, 0x30, 8, 300);
        t.free(PID, 3, 0x30, true);
        // Released by realloc.
        t.alloc(PID, 4, 0x40, 8, 400);
        t.free(PID, 4, 0x40, false);
        assert_eq!(t.of(100), Temporary::default());
        assert_eq!(t.of(300), Temporary::default());
        assert_eq!(t.of(400), Temporary::default());
        // Thread 1's newest (0x20) is still a candidate; frees of other
        // blocks in between do not change that.
        t.alloc(PID, 5, 0x50, 8, 500);
        t.free(PID, 1, 0x50, true);
        t.free(PID, 1, 0x20, true);
        assert_eq!(
            t.of(200),
            Temporary {
                objects: 1,
                bytes: 8
            }
        );
        assert_eq!(t.of(500), Temporary::default());
    }

    #[test]
    fn a_freed_address_reused_by_another_thread_is_that_threads() {
        let mut t = Temporaries::default();
        t.alloc(PID, 1, 0x10, 8, 100);
        t.free(PID, 2, 0x10, true);
        t.alloc(PID, 2, 0x10, 8, 200);
        // Thread 1 frees the block thread 2 now holds at that address.
        t.free(PID, 1, 0x10, true);
        assert_eq!(t.of(100), Temporary::default());
        assert_eq!(t.of(200), Temporary::default());
    }

    #[test]
    fn an_address_allocated_again_after_a_lost_free_is_the_new_threads() {
        let mut t = Temporaries::default();
        // Thread 1's block at 0x10 is freed, but the FREE is lost.
        t.alloc(PID, 1, 0x10, 8, 100);
        t.alloc(PID, 2, 0x10, 16, 200);
        assert_eq!(t.threads(), 1, "thread 1's block is gone");
        t.free(PID, 2, 0x10, true);
        assert_eq!(t.of(100), Temporary::default());
        assert_eq!(
            t.of(200),
            Temporary {
                objects: 1,
                bytes: 16
            }
        );
        // The same thread allocating the same address again after a lost free.
        t.alloc(PID, 3, 0x30, 8, 300);
        t.alloc(PID, 3, 0x30, 8, 300);
        assert_eq!(t.threads(), 1);
        t.free(PID, 3, 0x30, true);
        assert_eq!(t.of(300).objects, 1);
        assert_eq!(t.threads(), 0);
    }

    #[test]
    fn state_is_freed_at_exit_and_bounded() {
        let mut t = Temporaries::default();
        t.alloc(PID, 1, 0x10, 8, 100);
        t.alloc(PID, 2, 0x20, 8, 100);
        t.alloc(PID + 1, 3, 0x20, 8, 100);
        t.forget_process(PID);
        assert_eq!(t.threads(), 1);
        t.free(PID, 1, 0x10, true);
        assert_eq!(t.of(100), Temporary::default(), "forgotten at exit");
        for tid in 0..MAX_THREADS as u32 + 10 {
            t.alloc(PID, tid + 10, u64::from(tid) * 16, 8, 1);
        }
        assert_eq!(t.threads(), MAX_THREADS);
        assert_eq!(t.untracked, 11);
        t.forget_process(PID);
        assert_eq!(t.threads(), 1);
        // Merged into a group's stack with the process's.
        t.alloc(PID + 2, 9, 0x90, 4, 600);
        t.free(PID + 2, 9, 0x90, true);
        t.merge(600, 700);
        assert_eq!(t.of(700).objects, 1);
    }
}
