//! Address normalization while a process lives, and one open file per
//! mapped object, so `symbolize.rs` names frames after processes exited.
//! `Modules` is the façade the collector calls; each part of the job has a
//! room of its own, tested alone: the open-object table (objects.rs), a
//! process's maps (process_maps.rs) and when they are read again
//! (reread.rs), code generations (code_history.rs), naming addresses
//! (normalize.rs), JIT names (jit_frames.rs), the kernel tables' sync
//! (kernel_sync.rs).
//!
//! ```ignore
//! let mut modules = Modules::new(kernel_tables, code_gens, shown_as);
//! modules.refresh(pid);                          // a process found
//! modules.stack_taken(pid, gen, None);           // an event's stack
//! let frames = modules.normalize(pid, &addrs, Some(gen));
//! modules.drop_process(pid);                     // it exited
//! ```

use std::{collections::BTreeSet, path::PathBuf, time::Instant};

use super::{kernel_tables::KernelTables, shown_as::ShownAs, trampolines::JitCode};
use crate::tracee::process::Mapping;

mod code_history;
mod jit_frames;
mod kernel_sync;
mod normalize;
mod objects;
mod process;
mod process_maps;
mod reread;
#[cfg(test)]
mod tests;

use code_history::CodeHistory;
pub use code_history::{BpfCodeGens, CodeGens};
pub use jit_frames::{JitFrames, JIT_MODULE_PATH};
pub use kernel_sync::KernelSync;
use normalize::Normalizer;
pub use normalize::{CodeStats, NormFrame};
pub use objects::ObjectTable;
use process::Proc;
use reread::MIN_REREAD_INTERVAL;
use tracer_common::CodeMaps;

/// `Default`: without kernel tables, code generations or renamed
/// programs (the tests).
#[derive(Default)]
pub struct Modules {
    objects: ObjectTable,
    procs: crate::hashing::FastMap<u32, Proc>,
    /// Source of `Proc::generation`: unique across pids and their reuse.
    generations: u64,
    /// Processes whose maps could not be read before they exited.
    unread: BTreeSet<u32>,
    /// Executables shown under the name they were invoked by (a symbolic
    /// link to them: --binary LINK, or a process's argv[0]).
    shown_as: ShownAs,
    kernel: KernelSync,
    jit_frames: JitFrames,
    /// The kernel side's code generations (None in the tests that do not
    /// need them: stacks are then named from the maps as read).
    code_gens: Option<Box<dyn CodeGens>>,
    code_stats: CodeStats,
}

impl Modules {
    /// `kernel`: the tables of `--unwind tables`; `code_gens`: the kernel
    /// side's code generations; `shown_as`: names given to executables.
    pub fn new(
        kernel: Option<KernelTables>,
        code_gens: Option<Box<dyn CodeGens>>,
        shown_as: ShownAs,
    ) -> Modules {
        Modules {
            kernel: KernelSync::new(kernel),
            code_gens,
            shown_as,
            ..Modules::default()
        }
    }

    /// Re-reads /proc/PID/maps, rate-limited (`reread.rs`). Returns
    /// whether the maps were read (false too when the process is gone).
    pub fn refresh(&mut self, pid: u32) -> bool {
        let p = self.procs.get_mut(&pid);
        if p.is_some_and(|p| !p.reads.may_read(Instant::now(), MIN_REREAD_INTERVAL)) {
            return false;
        }
        self.refresh_now(pid)
    }

    /// `refresh` without the rate limit.
    pub fn refresh_now(&mut self, pid: u32) -> bool {
        let Some((text, code)) = code_history::read_maps(pid, self.code_gens.as_deref()) else {
            self.note_unread(pid);
            return false;
        };
        let maps = crate::tracee::process::parse_maps(&text);
        if maps.is_empty() {
            self.note_unread(pid);
            return false; // a zombie: keep what we had
        }
        let image_read = self.procs.get(&pid).is_some_and(|p| !p.maps.is_empty());
        self.merge_maps(pid, maps);
        if !image_read {
            self.shown_as.note_process(pid);
        }
        self.set_jit(pid, crate::tracee::process::parse_jit(&text));
        self.note_read(pid, code.as_ref());
        true
    }

    /// `pid`'s anonymous executable ranges as read now: the new ones are
    /// read for CPython's trampolines (`trampolines.rs`); if anything
    /// changed, they are described to the kernel's walker and the
    /// process's generation changes (a user-space walk that stopped in
    /// JIT code is done again).
    fn set_jit(&mut self, pid: u32, jit: Vec<std::ops::Range<u64>>) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.jit.update(pid, jit) {
            self.generations += 1;
            p.generation = self.generations;
            self.describe_to_kernel(pid);
        }
    }

    /// The maps of `pid` were read (and described to the kernel's walker)
    /// at `code`'s generation: tell the kernel side, whose walks trust the
    /// tables from then on.
    fn note_read(&mut self, pid: u32, code: Option<&CodeMaps>) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.code = CodeHistory::at_read(code);
        if let Some(gens) = &mut self.code_gens {
            gens.read_at(pid, p.code.read_gen());
        }
    }

    /// The maps could not be read (it is gone): no retry for a while.
    fn note_unread(&mut self, pid: u32) {
        self.unread.insert(pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.reads.unread(Instant::now());
        }
    }

    /// A stack of `pid` taken at code generation `gen` arrives: if the
    /// process mapped code since its maps were read, they are read again
    /// (once per generation). `walk_end`: where a kernel walk of it ended
    /// early, at a frame it could not follow (`walk_ended_at`).
    pub fn stack_taken(&mut self, pid: u32, gen: u32, walk_end: Option<u64>) {
        let p = self.procs.get_mut(&pid);
        if p.is_some_and(|p| p.code.wants_read(gen)) {
            self.refresh_now(pid);
        }
        if let Some(pc) = walk_end {
            self.walk_ended_at(pid, pc);
        }
    }

    /// A kernel walk of `pid` ended early at `pc`: the table used there may
    /// be that of a library unloaded since, with another loaded at its
    /// addresses (dlclose, dlopen). The maps are read again as
    /// `ReadPolicy::after_walk_end` allows; a change describes the new
    /// code to the kernel.
    fn walk_ended_at(&mut self, pid: u32, pc: u64) {
        let Some(p) = self.procs.get_mut(&pid) else {
            self.refresh(pid);
            return;
        };
        if p.reads.after_walk_end(pc, Instant::now()) {
            self.refresh_now(pid);
        }
    }

    /// The first of `return_addrs` of a stack of `pid` taken at `gen`
    /// that may not be named from the maps as read: other code was mapped
    /// at its address since (code_history.rs).
    pub fn first_unsure(&self, pid: u32, return_addrs: &[u64], gen: Option<u32>) -> Option<usize> {
        let p = self.procs.get(&pid)?;
        return_addrs
            .iter()
            .position(|&a| !p.sure(a.saturating_sub(1), gen))
    }

    /// Every process with maps kept here.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// Processes whose maps could not be read (again) because they had
    /// exited: addresses outside the maps read before have no names.
    pub fn unread(&self) -> &BTreeSet<u32> {
        &self.unread
    }

    /// Merges freshly read maps into what is known for `pid`
    /// (`ProcessMaps::merge`); objects are opened for new files only.
    fn merge_maps(&mut self, pid: u32, new: Vec<Mapping>) {
        let mut maps = (self.procs.get_mut(&pid))
            .map(|p| std::mem::take(&mut p.maps))
            .unwrap_or_default();
        let objects = &mut self.objects;
        let merged = maps.merge(new, |m| objects.identify(pid, m));
        for &o in maps.objects() {
            self.objects.retain(o);
        }
        for &o in &merged.released {
            self.objects.release(o);
        }
        // Unchanged maps keep their generation: nothing to rebuild.
        if merged.maps_changed {
            self.generations += 1;
        }
        let generation = self.generations;
        let p = self
            .procs
            .entry(pid)
            .or_insert_with(|| Proc::new(generation));
        p.read(maps, &merged, generation, Instant::now());
        self.unread.remove(&pid);
        if merged.changed {
            self.describe_to_kernel(pid);
        }
    }

    /// `--unwind tables`, about every second: kept tables unused for
    /// their TTL go, and the processes using a file whose table waited
    /// for rows that can be had now are described again (which loads it).
    pub fn tick_tables(&mut self, now: Instant) {
        for pid in self.kernel.tick(now) {
            self.describe_to_kernel(pid);
        }
    }

    /// How many times `pid`'s maps were found to hold other code at an
    /// address range than before (see `Proc::remaps`).
    pub fn remaps(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |p| p.remaps)
    }

    /// `--unwind tables`: tells the kernel's walker about `pid`'s maps.
    fn describe_to_kernel(&mut self, pid: u32) {
        if let Some(p) = self.procs.get(&pid) {
            self.kernel.describe(pid, &p.maps, &p.jit, &self.objects);
        }
    }

    /// `--unwind tables`: the kernel tables, and the largest file that
    /// did not fit.
    pub fn kernel(&self) -> &KernelSync {
        &self.kernel
    }

    /// `--unwind tables`: builds the table of `path` before any process
    /// maps it (a started command's program and libraries).
    pub fn prepare_table(&mut self, path: &std::path::Path) {
        self.kernel.prepare(path);
    }

    /// Whether `addr` lies in a mapping known for `pid`.
    pub fn covers(&self, pid: u32, addr: u64) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|p| p.maps.find_index(addr).is_some())
    }

    /// The process exec'ed: its maps are read again at its next event
    /// (objects its interned frames refer to stay, for stacks of the old
    /// image). Its JIT code goes too: else the first sync describes the
    /// old image's to the kernel's walker.
    pub fn forget(&mut self, pid: u32) {
        self.kernel.drop_process(pid);
        self.jit_frames.forget(pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            for o in p.exec() {
                self.objects.release(o);
            }
        }
    }

    /// `child` was forked from `parent`: fork copies the address space, so
    /// it maps what the parent maps, and takes the parent's maps and
    /// objects as they are (nothing read, opened or stat'ed). Whether the
    /// parent's maps were known.
    pub fn forked(&mut self, parent: u32, child: u32) -> bool {
        self.forget(child);
        let Some(p) = self.procs.get(&parent).filter(|p| !p.maps.is_empty()) else {
            return false;
        };
        self.generations += 1;
        let mut c = p.fork(self.generations, Instant::now());
        for &o in c.maps.objects() {
            self.objects.retain(o);
        }
        // A pid seen before keeps its count: the stacks interned for it
        // compare with it.
        c.remaps = self.remaps(child);
        self.procs.insert(child, c);
        self.unread.remove(&child);
        self.describe_to_kernel(child);
        true
    }

    /// The process exited and its events are handled: all of it goes but
    /// the objects its frames refer to.
    pub fn drop_process(&mut self, pid: u32) {
        self.kernel.drop_process(pid);
        self.jit_frames.forget(pid);
        if let Some(gens) = &mut self.code_gens {
            gens.forget(pid);
        }
        let objects = self.procs.remove(&pid).map(|mut p| p.maps.clear());
        objects
            .into_iter()
            .flatten()
            .for_each(|o| self.objects.release(o));
    }

    /// How many processes and objects are held (for --verbose and tests).
    pub fn held(&self) -> (usize, usize) {
        (self.procs.len(), self.objects.held())
    }

    /// Changes each time `pid`'s maps (files or JIT code) are set (to
    /// rebuild what was built from older ones).
    pub fn generation(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |p| p.generation)
    }

    /// Sets `pid`'s maps as read elsewhere: its file mappings and its
    /// anonymous executable ones (JIT code), both described to the
    /// kernel's walker (else a walk through JIT code goes back to user
    /// space until the maps are read again).
    pub fn set_maps(&mut self, pid: u32, maps: Vec<Mapping>, jit: Vec<std::ops::Range<u64>>) {
        self.forget(pid);
        self.merge_maps(pid, maps);
        self.shown_as.note_process(pid);
        self.set_jit(pid, jit);
        let code = self.code_gens.as_ref().and_then(|g| g.current(pid));
        self.note_read(pid, code.as_ref());
    }

    /// The process's anonymous executable mappings (JIT code) as last
    /// read, and the CPython trampolines among them.
    pub fn jit(&self, pid: u32) -> &JitCode {
        static NONE: JitCode = JitCode::EMPTY;
        self.procs.get(&pid).map_or(&NONE, |p| &p.jit)
    }

    /// The process's file-backed mappings as last read.
    pub fn maps(&self, pid: u32) -> &[Mapping] {
        self.procs.get(&pid).map_or(&[], |p| p.maps.maps())
    }

    /// The file mapping `m` of `pid` shows, as the kernel's walker is
    /// given it: (device, inode) and a path to the copy held open here.
    /// None when `m` is not one of its maps as last read, or its file was
    /// not opened.
    pub fn file_of(&self, pid: u32, m: &Mapping) -> Option<((u64, u64), PathBuf)> {
        let (found, object) = self.procs.get(&pid)?.maps.find(m.start)?;
        (found == m).then(|| self.objects.open_file(object))?
    }

    /// Names executables by the name they were invoked by.
    pub fn shown_as(&self) -> &ShownAs {
        &self.shown_as
    }

    /// Stacks with frames left unnamed because their code was replaced.
    pub fn code_stats(&self) -> CodeStats {
        self.code_stats
    }

    /// Normalizes return addresses of process `pid`, taken at code
    /// generation `gen` (None: not known, named from the maps as read).
    /// Re-reads the maps once if an address is not covered (a library
    /// loaded after the last read). An address where other code was mapped
    /// since the stack was taken stays unnamed (counted).
    pub fn normalize(
        &mut self,
        pid: u32,
        return_addrs: &[u64],
        gen: Option<u32>,
    ) -> Vec<NormFrame> {
        if !return_addrs
            .iter()
            .all(|&a| self.covers(pid, a.saturating_sub(1)))
        {
            self.refresh(pid);
        }
        let (mut names, stats) = self.names(pid);
        names.stack(return_addrs, gen, stats)
    }

    /// What names `pid`'s frames, and the counts it keeps.
    fn names(&mut self, pid: u32) -> (Normalizer<'_>, &mut CodeStats) {
        let names = Normalizer {
            pid,
            proc: self.procs.get(&pid),
            objects: &mut self.objects,
            jit: &mut self.jit_frames,
        };
        (names, &mut self.code_stats)
    }

    /// `frames` of `pid` with the addresses in no file named from its JIT's
    /// files if they have a name now; None when none has.
    pub fn name_jit(&mut self, pid: u32, frames: &[NormFrame]) -> Option<Vec<NormFrame>> {
        self.names(pid).0.name_jit(frames)
    }

    /// Reads what `pid`'s JIT files gained, now (no rate limit): at its
    /// exit, when the JIT has flushed them.
    pub fn read_jit_now(&mut self, pid: u32) {
        if let Some(p) = self.procs.get(&pid) {
            self.jit_frames.read_now(pid, p.maps.maps());
        }
    }

    /// The names of JIT frames, and what reading them counted.
    pub fn jit_frames(&self) -> &JitFrames {
        &self.jit_frames
    }

    pub fn path(&self, module: u32) -> &str {
        if self.jit_frames.name_of(module).is_some() {
            return JIT_MODULE_PATH;
        }
        self.objects.path(module).unwrap_or("[unknown]")
    }

    /// The objects frames refer to: their files, held open, and debug
    /// information.
    pub fn objects(&self) -> &ObjectTable {
        &self.objects
    }
}
