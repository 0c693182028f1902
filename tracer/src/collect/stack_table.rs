//! The interned stacks: one entry per (process, stack), each distinct
//! frame list kept once, looked up by the kernel's stack id or by the
//! unwound addresses; a process's stacks folded into its group's when it
//! exits.

use crate::hashing::{FastMap, FastSet};
use std::sync::Arc;

use crate::{
    collect::processes::ProcessIndex,
    model::heap::StackHandle,
    stacks::modules::{Modules, NormFrame},
};

/// An interned stack: the process it belongs to and its frames, leaf first.
pub struct Stack {
    pub pid: u32,
    /// The process (pid and start time) in the collector's `ProcessTable`.
    pub process: ProcessIndex,
    /// None when the stack could not be captured. Shared by every stack
    /// with these frames: the same code path in many processes of one
    /// program is kept once.
    pub frames: Option<Arc<[NormFrame]>>,
    /// The walk stopped before the root (DWARF and tables modes).
    pub truncated: bool,
}

#[derive(Default)]
pub struct StackTable {
    /// Indexed by handle; a handle freed by `fold` is reused.
    stacks: Vec<Stack>,
    free: Vec<StackHandle>,
    /// Frame-pointer mode: the kernel's stack id, per running process
    /// (negative ids, failed captures, share one entry per process).
    by_id: FastMap<u32, FastMap<i32, StackHandle>>,
    /// DWARF and tables modes: the unwound addresses, per running process,
    /// keyed by the addresses followed by 1 if the stack is truncated, else
    /// 0 (one slice, so that a lookup needs no allocation: `addrs_key`).
    by_addrs: FastMap<u32, FastMap<Box<[u64]>, StackHandle>>,
    /// The lookup key of the last `intern_addrs`, reused.
    addrs_key: Vec<u64>,
    /// The stacks of each process (by `ProcessIndex`) until it is folded.
    of_process: FastMap<ProcessIndex, Vec<StackHandle>>,
    /// Folded stacks: one per (group, frame list, truncated).
    folded: FastMap<(ProcessIndex, usize, bool), StackHandle>,
    /// Every distinct frame list once.
    frame_lists: FastSet<Arc<[NormFrame]>>,
    /// Stacks of running processes with an address in no file (JIT code
    /// whose name the JIT had not written yet when the stack was interned:
    /// node's perf map comes through a stdio buffer), named again later.
    /// Bounded by the stacks held; a process's entry goes when it exits.
    pending_names: FastMap<u32, Vec<StackHandle>>,
    /// `Modules::remaps` of each process whose maps were found remapped,
    /// as of its last interned stack; a process's entry goes when it
    /// execs or exits.
    remaps_seen: FastMap<u32, u64>,
}

impl StackTable {
    /// Process `pid`'s maps hold other code at some addresses than when
    /// its stacks were interned (a library unloaded and another loaded in
    /// its place: `Modules::remaps`): the addresses interned before are
    /// not reused, and stacks waiting for names are named no more (their
    /// addresses mean other code now).
    pub(super) fn note_remaps(&mut self, pid: u32, remaps: u64) {
        if self.remaps_seen.get(&pid).copied().unwrap_or(0) != remaps {
            self.by_id.remove(&pid);
            self.by_addrs.remove(&pid);
            self.pending_names.remove(&pid);
            self.remaps_seen.insert(pid, remaps);
        }
    }

    pub fn get(&self, h: StackHandle) -> Option<&Stack> {
        self.stacks.get(h as usize)
    }

    /// Frame-pointer mode: `pid`'s stack with the kernel's stack `id`.
    pub(super) fn by_stack_id(&self, pid: u32, id: i32) -> Option<StackHandle> {
        self.by_id.get(&pid)?.get(&id).copied()
    }

    /// Holds `stack`, found again by `pid` and the kernel's stack `id`.
    pub(super) fn add_by_stack_id(&mut self, pid: u32, id: i32, stack: Stack) -> StackHandle {
        let h = self.push(stack);
        self.by_id.entry(pid).or_default().insert(id, h);
        h
    }

    /// DWARF and tables modes: `pid`'s stack with these addresses. The
    /// key is kept for `add_by_addrs`.
    pub(super) fn by_addrs(
        &mut self,
        pid: u32,
        addrs: &[u64],
        truncated: bool,
    ) -> Option<StackHandle> {
        let key = &mut self.addrs_key;
        key.clear();
        key.extend_from_slice(addrs);
        key.push(u64::from(truncated));
        self.by_addrs.get(&pid)?.get(key.as_slice()).copied()
    }

    /// Holds `stack`, found again by the addresses of the last `by_addrs`;
    /// one with a frame in no file is named again later (`name_pending`).
    pub(super) fn add_by_addrs(&mut self, stack: Stack) -> StackHandle {
        let pid = stack.pid;
        let unnamed = (stack.frames.as_ref()).is_some_and(|f| f.iter().any(|f| f.module.is_none()));
        let key: Box<[u64]> = self.addrs_key.as_slice().into();
        let h = self.push(stack);
        if unnamed {
            self.pending_names.entry(pid).or_default().push(h);
        }
        self.by_addrs.entry(pid).or_default().insert(key, h);
        h
    }

    pub fn all_frames(&self) -> impl Iterator<Item = &NormFrame> {
        self.frame_lists.iter().flat_map(|f| f.iter())
    }

    pub(super) fn intern_frames(&mut self, frames: Vec<NormFrame>) -> Arc<[NormFrame]> {
        if let Some(known) = self.frame_lists.get(frames.as_slice()) {
            return known.clone();
        }
        let frames: Arc<[NormFrame]> = frames.into();
        self.frame_lists.insert(frames.clone());
        frames
    }

    /// Process `pid` has a new image (or exited): its addresses mean other
    /// code now. Interned stacks stay (the heap refers to them) but are not
    /// reused.
    pub(super) fn forget_process(&mut self, pid: u32) {
        self.by_id.remove(&pid);
        self.by_addrs.remove(&pid);
        self.pending_names.remove(&pid);
        self.remaps_seen.remove(&pid);
    }

    pub(super) fn push(&mut self, stack: Stack) -> StackHandle {
        let process = stack.process;
        let h = match self.free.pop() {
            Some(h) => {
                self.stacks[h as usize] = stack;
                h
            }
            None => {
                self.stacks.push(stack);
                (self.stacks.len() - 1) as StackHandle
            }
        };
        self.of_process.entry(process).or_default().push(h);
        h
    }

    /// Process `process` exited and is folded into `group`: each of its
    /// stacks is summed into the group's stack with the same frames
    /// (`merge(from, into)` moves the numbers) and its handle is freed.
    pub(super) fn fold(
        &mut self,
        process: ProcessIndex,
        group: ProcessIndex,
        mut merge: impl FnMut(StackHandle, StackHandle),
    ) {
        for h in self.of_process.remove(&process).unwrap_or_default() {
            let stack = std::mem::replace(
                &mut self.stacks[h as usize],
                Stack {
                    pid: 0,
                    process: ProcessIndex::MAX,
                    frames: None,
                    truncated: false,
                },
            );
            let frames = stack.frames.map(|f| self.canonical(f));
            let ptr = frames.as_ref().map_or(0, |f| f.as_ptr() as usize);
            let key = (group, ptr, stack.truncated);
            let into = match self.folded.get(&key) {
                Some(&into) => into,
                None => {
                    let into = self.push(Stack {
                        pid: 0,
                        process: group,
                        frames,
                        truncated: stack.truncated,
                    });
                    self.folded.insert(key, into);
                    into
                }
            };
            merge(h, into);
            self.free.push(h);
        }
    }

    /// A folded stack's frames: addresses outside every mapped file (a
    /// process gone before its maps were read) differ from process to
    /// process (ASLR), so they become one `[unknown]` frame; the process's
    /// own list is dropped once no stack holds it.
    fn canonical(&mut self, frames: Arc<[NormFrame]>) -> Arc<[NormFrame]> {
        if frames.iter().all(|f| f.module.is_some()) {
            return frames;
        }
        let mut known: Vec<NormFrame> = Vec::with_capacity(frames.len());
        for f in frames.iter() {
            let f = match f.module {
                Some(_) => *f,
                None => NormFrame {
                    module: None,
                    offset: 0,
                },
            };
            if f.module.is_some() || known.last() != Some(&f) {
                known.push(f);
            }
        }
        // Held by the set and by `frames` only: no other stack uses it.
        if Arc::strong_count(&frames) == 2 {
            self.frame_lists.remove(&frames);
        }
        self.intern_frames(known)
    }

    /// Names the JIT frames of `pid`'s stacks (every process's: None) that
    /// had no name when interned, if the JIT has written their names since.
    pub fn name_pending(&mut self, modules: &mut Modules, pid: Option<u32>) {
        let pids: Vec<u32> = match pid {
            Some(pid) => vec![pid],
            None => self.pending_names.keys().copied().collect(),
        };
        for pid in pids {
            let Some(handles) = self.pending_names.remove(&pid) else {
                continue;
            };
            // What the JIT wrote since (incremental: only new bytes).
            modules.read_jit_now(pid);
            let mut still = Vec::new();
            for h in handles {
                let Some(stack) = self.stacks.get(h as usize).filter(|s| s.pid == pid) else {
                    continue; // folded or reused
                };
                let Some(frames) = stack.frames.clone() else {
                    continue;
                };
                let named = modules.name_jit(pid, &frames);
                let frames = match named {
                    Some(named) => {
                        let named = self.intern_frames(named);
                        self.stacks[h as usize].frames = Some(named.clone());
                        named
                    }
                    None => frames,
                };
                if frames.iter().any(|f| f.module.is_none()) {
                    still.push(h);
                }
            }
            if !still.is_empty() {
                self.pending_names.insert(pid, still);
            }
        }
    }

    /// Stacks held (live handles, for --verbose and tests).
    pub fn held(&self) -> usize {
        self.stacks.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(table: &mut StackTable, unknown_at: u64) -> Arc<[NormFrame]> {
        table.intern_frames(vec![
            NormFrame {
                module: Some(1),
                offset: 0x10,
            },
            NormFrame {
                module: None,
                offset: unknown_at,
            },
            NormFrame {
                module: None,
                offset: unknown_at + 8,
            },
        ])
    }

    #[test]
    fn folded_processes_share_one_stack_and_their_own_lists_and_handles_go() {
        let mut t = StackTable::default();
        // Two processes of one program, gone before their maps were read:
        // the same code path at different (ASLR) unknown addresses.
        for (process, addr) in [(1, 0x7f00_0000), (2, 0x7e00_0000)] {
            let frames = Some(frames(&mut t, addr));
            t.push(Stack {
                pid: 100 + process,
                process,
                frames,
                truncated: true,
            });
        }
        assert_eq!(t.frame_lists.len(), 2);
        let mut merged = Vec::new();
        t.fold(1, 9, |from, into| merged.push((from, into)));
        t.fold(2, 9, |from, into| merged.push((from, into)));
        // One folded stack for both, holding one canonical list.
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].1, merged[1].1);
        let folded = t.get(merged[0].1).expect("folded stack");
        assert_eq!((folded.pid, folded.process), (0, 9));
        let offsets: Vec<_> = folded
            .frames
            .as_ref()
            .expect("frames")
            .iter()
            .map(|f| (f.module, f.offset))
            .collect();
        assert_eq!(offsets, [(Some(1), 0x10), (None, 0)]);
        assert_eq!(t.frame_lists.len(), 1, "the per-process lists are gone");
        // Their handles are reused: held = the folded stack only.
        assert_eq!(t.held(), 1);
        let h = t.push(Stack {
            pid: 7,
            process: 3,
            frames: None,
            truncated: false,
        });
        assert!(
            merged.iter().any(|&(from, _)| from == h),
            "handle {h} reused"
        );
    }
}
