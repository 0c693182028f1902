//! Call stacks as the collector interns them: one entry per (process,
//! stack), read from the kernel's stack map (frame pointers) or unwound
//! from a copied stack (DWARF), normalized to (object, file offset) while
//! the process is alive, each distinct frame list kept once.

use crate::hashing::{FastMap, FastSet};
use std::{collections::HashMap, sync::Arc};

use tracer_common::{FramesHeader, FRAMES_ENDED, FRAMES_RESUME, FRAMES_TRUNCATED, MAX_FRAMES};

use aya::maps::{MapData, StackTraceMap};

use crate::{
    collect::{processes::ProcessIndex, reader::read_pod},
    model::heap::StackHandle,
    stacks::{
        modules::{Modules, NormFrame},
        unwind::{Sample, Unwinders, Unwound},
    },
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

    pub fn all_frames(&self) -> impl Iterator<Item = &NormFrame> {
        self.frame_lists.iter().flat_map(|f| f.iter())
    }

    fn intern_frames(&mut self, frames: Vec<NormFrame>) -> Arc<[NormFrame]> {
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

    fn push(&mut self, stack: Stack) -> StackHandle {
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

/// Turns what an event carries (a kernel stack id, a copied stack, the
/// frames the kernel walked) into an interned stack: owns the kernel's
/// stack map, the stack table and the unwinders; the processes' maps
/// (`Modules`) stay the collector's and are lent to each call.
pub struct StackInterner {
    stack_map: StackTraceMap<MapData>,
    pub table: StackTable,
    pub unwinders: Unwinders,
    /// The maps generation each process's unwinder was last rebuilt for.
    unwinder_maps: HashMap<u32, u64>,
    /// An event's return addresses, reused (at most MAX_FRAMES).
    frames_buf: Vec<u64>,
    /// Developer aid: MEMTRACE_RECORD_SAMPLES=FILE writes every DWARF sample
    /// with its unwound addresses as a JSON line (unwinder test fixtures).
    sample_log: Option<std::io::BufWriter<std::fs::File>>,
}

impl StackInterner {
    pub(super) fn new(stack_map: StackTraceMap<MapData>) -> Self {
        StackInterner {
            stack_map,
            table: StackTable::default(),
            unwinders: Unwinders::default(),
            unwinder_maps: HashMap::new(),
            frames_buf: Vec::new(),
            sample_log: std::env::var_os("MEMTRACE_RECORD_SAMPLES")
                .and_then(|path| std::fs::File::create(path).ok())
                .map(std::io::BufWriter::new),
        }
    }

    /// Process `pid` has a new image, or is a new process: its stacks are
    /// not reused and its unwinder is rebuilt.
    pub(super) fn forget_process(&mut self, pid: u32) {
        self.table.forget_process(pid);
        self.unwinders.invalidate(pid);
    }

    /// Process `pid` is gone: also what its unwinder was built for.
    pub(super) fn drop_process(&mut self, pid: u32) {
        self.forget_process(pid);
        self.unwinder_maps.remove(&pid);
    }

    pub(super) fn intern_stack_id(
        &mut self,
        modules: &mut Modules,
        pid: u32,
        process: ProcessIndex,
        stack_id: i32,
    ) -> StackHandle {
        let id = if stack_id < 0 { -1 } else { stack_id };
        self.table.note_remaps(pid, modules.remaps(pid));
        if let Some(&h) = self.table.by_id.get(&pid).and_then(|ids| ids.get(&id)) {
            return h;
        }
        let frames = if stack_id < 0 {
            None
        } else {
            self.stack_map
                .get(&(stack_id as u32), 0)
                .ok()
                .map(|st| st.frames().iter().map(|f| f.ip).collect::<Vec<_>>())
                .map(|ips| modules.normalize(pid, &ips, None))
                .map(|frames| self.table.intern_frames(frames))
        };
        let h = self.table.push(Stack {
            pid,
            process,
            frames,
            truncated: false,
        });
        self.table.by_id.entry(pid).or_default().insert(id, h);
        h
    }

    /// Unwinds with the process's unwinder, rebuilt first if its maps were
    /// read since it was built.
    fn unwind(&mut self, modules: &Modules, pid: u32, sample: &Sample<'_>) -> Unwound {
        let now = modules.generation(pid);
        if self.unwinder_maps.insert(pid, now) != Some(now) {
            self.unwinders.invalidate(pid);
        }
        let file_of = |m: &crate::tracee::process::Mapping| modules.file_of(pid, m);
        self.unwinders
            .unwind(pid, modules.maps(pid), modules.jit(pid), sample, &file_of)
    }

    /// DWARF mode: a copied stack taken at code generation `gen`.
    pub(super) fn intern_sample(
        &mut self,
        modules: &mut Modules,
        pid: u32,
        process: ProcessIndex,
        sample: &Sample<'_>,
        gen: u32,
    ) -> StackHandle {
        if sample.stack.is_empty() {
            return self.intern_stack_id(modules, pid, process, -1);
        }
        modules.stack_taken(pid, gen, None);
        let unwound = self.unwind_sample(modules, pid, sample, gen);
        self.intern_addrs(
            modules,
            pid,
            process,
            &unwound.addrs,
            unwound.truncated,
            gen,
        )
    }

    /// Tables mode: the return addresses the kernel walked; with a resume
    /// copy (the walk met an address user space had not described), the
    /// rest unwound here from the copy, and the process's maps read again
    /// so that its next walks know them.
    /// `h`: the event's header (process, code generation, how the walk
    /// ended); `frames`: the addresses it walked.
    pub(super) fn intern_frames(
        &mut self,
        modules: &mut Modules,
        h: &FramesHeader,
        process: ProcessIndex,
        frames: &[u64],
        resume: Option<&Sample<'_>>,
    ) -> StackHandle {
        let (pid, gen) = (h.event.pid, h.maps_gen);
        let ended = h.flags & (FRAMES_TRUNCATED | FRAMES_ENDED) != 0;
        let Some(sample) = resume else {
            return self.intern_addrs(modules, pid, process, frames, ended, gen);
        };
        self.unwinders.stats.resumed += 1;
        if sample.stack.is_empty() {
            self.unwinders.stats.resumed_cut += 1;
            return self.intern_addrs(modules, pid, process, frames, true, gen);
        }
        let unwound = self.unwind_sample(modules, pid, sample, gen);
        self.unwinders.stats.resumed_cut += u64::from(unwound.truncated);
        let mut addrs = frames.to_vec();
        addrs.extend(unwound.addrs);
        self.intern_addrs(modules, pid, process, &addrs, unwound.truncated, gen)
    }

    /// An EVENT_ALLOC_FRAMES (tracer_common::FramesHeader): its stack.
    pub(super) fn intern_frames_event(
        &mut self,
        modules: &mut Modules,
        bytes: &[u8],
        process: ProcessIndex,
    ) -> Option<StackHandle> {
        let h = read_pod::<FramesHeader>(bytes)?;
        let start = std::mem::size_of::<FramesHeader>();
        // A buffer reused from event to event: the bytes may not be
        // aligned for u64.
        let mut frames = std::mem::take(&mut self.frames_buf);
        frames.clear();
        frames.extend(
            bytes
                .get(start..start + 8 * h.depth as usize)?
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default())),
        );
        // A walk that ended at a frame it could not follow may have used
        // the table of a library unloaded since, at an address where
        // another is loaded now (dlclose, dlopen): the maps are read again,
        // which describes the new one to the kernel for the next walks and
        // names this stack with it.
        let ended_at = frames.last().filter(|_| h.flags & FRAMES_ENDED != 0);
        modules.stack_taken(h.event.pid, h.maps_gen, ended_at.copied());
        let handle = if h.flags & FRAMES_RESUME == 0 {
            Some(self.intern_frames(modules, &h, process, &frames, None))
        } else {
            let at = start + 8 * MAX_FRAMES;
            bytes.get(at..at + h.stack_len as usize).map(|stack| {
                let sample = Sample {
                    ip: h.ip,
                    sp: h.sp,
                    bp: h.bp,
                    stack,
                };
                self.intern_frames(modules, &h, process, &frames, Some(&sample))
            })
        };
        self.frames_buf = frames;
        handle
    }

    /// Unwinds a copied stack taken at code generation `gen` in user space
    /// (framehop). The unwind stops at an address where other code was
    /// mapped since (its rules would be the other code's).
    fn unwind_sample(
        &mut self,
        modules: &mut Modules,
        pid: u32,
        sample: &Sample<'_>,
        gen: u32,
    ) -> Unwound {
        // A library loaded since the maps were read (dlopen): read them
        // again. Maps read since the unwinder was built (the first read of
        // a new process may predate its libraries): rebuild it.
        if !modules.covers(pid, sample.ip) {
            modules.refresh(pid);
        }
        let mut unwound = self.unwind(modules, pid, sample);
        // The walk stopped early: maybe at a library mapped since the maps
        // were read (a new process's first read may catch its loader half
        // way). Read them again (rate-limited) and, if they changed, walk
        // again.
        if unwound.truncated {
            let before = modules.generation(pid);
            if modules.refresh(pid) && modules.generation(pid) != before {
                unwound = self.unwind(modules, pid, sample);
            }
        }
        let unsure = modules.first_unsure(pid, &unwound.addrs, Some(gen));
        if let Some(i) = unsure.filter(|&i| i + 1 < unwound.addrs.len()) {
            unwound.addrs.truncate(i + 1);
            unwound.truncated = true;
        }
        let maps = modules.maps(pid);
        if let Some(out) = &mut self.sample_log {
            crate::stacks::unwind::record_sample(out, maps, sample, &unwound);
        }
        unwound
    }

    /// The stack with these addresses (`addrs[0]` the caller's IP, then
    /// return addresses), interned per process.
    fn intern_addrs(
        &mut self,
        modules: &mut Modules,
        pid: u32,
        process: ProcessIndex,
        addrs: &[u64],
        truncated: bool,
        gen: u32,
    ) -> StackHandle {
        self.table.note_remaps(pid, modules.remaps(pid));
        // A stack with an address whose code was replaced since it was
        // taken is not shared with the same addresses of the new code.
        let gen = Some(gen);
        if modules.first_unsure(pid, addrs, gen).is_some() {
            let frames = modules.normalize(pid, addrs, gen);
            let frames = self.table.intern_frames(frames);
            return self.table.push(Stack {
                pid,
                process,
                frames: Some(frames),
                truncated,
            });
        }
        let table = &mut self.table;
        let key = &mut table.addrs_key;
        key.clear();
        key.extend_from_slice(addrs);
        key.push(u64::from(truncated));
        if let Some(&h) = table.by_addrs.get(&pid).and_then(|s| s.get(key.as_slice())) {
            return h;
        }
        let key: Box<[u64]> = key.as_slice().into();
        let frames = modules.normalize(pid, addrs, gen);
        let unnamed = frames.iter().any(|f| f.module.is_none());
        let frames = self.table.intern_frames(frames);
        let h = self.table.push(Stack {
            pid,
            process,
            frames: Some(frames),
            truncated,
        });
        if unnamed {
            self.table.pending_names.entry(pid).or_default().push(h);
        }
        self.table.by_addrs.entry(pid).or_default().insert(key, h);
        h
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
