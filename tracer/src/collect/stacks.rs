//! Call stacks as the collector interns them: read from the kernel's
//! stack map (frame pointers), walked by the kernel (tables) or unwound
//! from a copied stack (DWARF), normalized to (object, file offset) while
//! the process is alive, and kept in the stack table (stack_table.rs).

use std::collections::HashMap;

use tracer_common::{FramesHeader, FRAMES_ENDED, FRAMES_RESUME, FRAMES_TRUNCATED, MAX_FRAMES};

use aya::maps::{MapData, StackTraceMap};

pub use super::stack_table::{Stack, StackTable};
use crate::{
    collect::{processes::ProcessIndex, reader::read_pod},
    model::heap::StackHandle,
    stacks::{
        modules::Modules,
        unwind::{Sample, Unwinders, Unwound},
    },
};

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
        if let Some(h) = self.table.by_stack_id(pid, id) {
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
        let stack = Stack {
            pid,
            process,
            frames,
            truncated: false,
        };
        self.table.add_by_stack_id(pid, id, stack)
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

    /// An EventKind::AllocFrames (tracer_common::FramesHeader): its stack.
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
        if let Some(h) = self.table.by_addrs(pid, addrs, truncated) {
            return h;
        }
        let frames = modules.normalize(pid, addrs, gen);
        let frames = self.table.intern_frames(frames);
        self.table.add_by_addrs(Stack {
            pid,
            process,
            frames: Some(frames),
            truncated,
        })
    }
}
