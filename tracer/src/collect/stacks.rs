//! Call stacks as the collector interns them: one entry per (process,
//! stack), read from the kernel's stack map (frame pointers) or unwound
//! from a copied stack (DWARF), normalized to (object, file offset) while
//! the process is alive, each distinct frame list kept once.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use crate::{
    collect::{collector::State, processes::ProcessIndex},
    model::heap::StackHandle,
    stacks::{symbolize::NormFrame, unwind::Sample},
};

/// An interned stack: the process it belongs to and its frames, leaf first.
pub struct Stack {
    pub pid: u32,
    /// The process (pid and start time) in `State::processes`.
    pub process: ProcessIndex,
    /// None when the stack could not be captured. Shared by every stack
    /// with these frames: the same code path in many processes of one
    /// program is kept once.
    pub frames: Option<Arc<[NormFrame]>>,
    /// The walk stopped before the root (DWARF mode only).
    pub truncated: bool,
}

#[derive(Default)]
pub struct StackTable {
    stacks: Vec<Stack>,
    /// Frame-pointer mode: the kernel's stack id per process (negative ids,
    /// failed captures, share one entry per process).
    by_id: HashMap<(u32, i32), StackHandle>,
    /// DWARF mode: the unwound addresses per process.
    by_addrs: HashMap<(u32, Vec<u64>, bool), StackHandle>,
    /// Every distinct frame list once.
    frame_lists: HashSet<Arc<[NormFrame]>>,
}

impl StackTable {
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
        self.by_id.retain(|k, _| k.0 != pid);
        self.by_addrs.retain(|k, _| k.0 != pid);
    }

    fn push(&mut self, stack: Stack) -> StackHandle {
        let h = self.stacks.len() as StackHandle;
        self.stacks.push(stack);
        h
    }
}

impl State {
    pub(super) fn intern_stack_id(
        &mut self,
        pid: u32,
        process: ProcessIndex,
        stack_id: i32,
    ) -> StackHandle {
        let key = (pid, if stack_id < 0 { -1 } else { stack_id });
        if let Some(&h) = self.stacks.by_id.get(&key) {
            return h;
        }
        let frames = if stack_id < 0 {
            None
        } else {
            self.stack_map
                .get(&(stack_id as u32), 0)
                .ok()
                .map(|st| st.frames().iter().map(|f| f.ip).collect::<Vec<_>>())
                .map(|ips| self.modules.normalize(pid, &ips))
                .map(|frames| self.stacks.intern_frames(frames))
        };
        let h = self.stacks.push(Stack {
            pid,
            process,
            frames,
            truncated: false,
        });
        self.stacks.by_id.insert(key, h);
        h
    }

    /// Unwinds with the process's unwinder, rebuilt first if its maps were
    /// read since it was built.
    fn unwind(&mut self, pid: u32, sample: &Sample<'_>) -> crate::stacks::unwind::Unwound {
        let now = self.modules.generation(pid);
        if self.unwinder_maps.insert(pid, now) != Some(now) {
            self.unwinders.invalidate(pid);
        }
        self.unwinders.unwind(pid, self.modules.maps(pid), sample)
    }

    pub(super) fn intern_sample(
        &mut self,
        pid: u32,
        process: ProcessIndex,
        sample: &Sample<'_>,
    ) -> StackHandle {
        if sample.stack.is_empty() {
            return self.intern_stack_id(pid, process, -1);
        }
        // A library loaded since the maps were read (dlopen): read them
        // again. Maps read since the unwinder was built (the first read of
        // a new process may predate its libraries): rebuild it.
        if !self.modules.covers(pid, sample.ip) {
            self.modules.refresh(pid);
        }
        let mut unwound = self.unwind(pid, sample);
        // The walk stopped early: maybe at a library mapped since the maps
        // were read (a new process's first read may catch its loader half
        // way). Read them again (rate-limited) and, if they changed, walk
        // again.
        if unwound.truncated {
            let before = self.modules.generation(pid);
            if self.modules.refresh(pid) && self.modules.generation(pid) != before {
                unwound = self.unwind(pid, sample);
            }
        }
        let maps = self.modules.maps(pid);
        if let Some(out) = &mut self.sample_log {
            crate::stacks::unwind::record_sample(out, maps, sample, &unwound);
        }
        let key = (pid, unwound.addrs, unwound.truncated);
        if let Some(&h) = self.stacks.by_addrs.get(&key) {
            return h;
        }
        let frames = self.modules.normalize(pid, &key.1);
        let frames = self.stacks.intern_frames(frames);
        let h = self.stacks.push(Stack {
            pid,
            process,
            frames: Some(frames),
            truncated: key.2,
        });
        self.stacks.by_addrs.insert(key, h);
        h
    }
}
