//! What is kept for one live process: its maps, when they are read again,
//! its JIT code, its remaps and the code generation its maps were read at.
//! Dropped when it exits.

use std::time::Instant;

use super::super::trampolines::JitCode;
use super::{
    code_history::CodeHistory,
    process_maps::{Merged, ProcessMaps},
    reread::ReadPolicy,
};

pub struct Proc {
    pub maps: ProcessMaps,
    pub reads: ReadPolicy,
    /// Changes each time the maps are set (`Modules::generation`).
    pub generation: u64,
    /// Anonymous executable mappings (JIT code) and the CPython
    /// trampolines among them, for the walkers.
    pub jit: JitCode,
    /// Reads that found an address range holding other code than before
    /// (a library unloaded and another loaded in its place): addresses
    /// interned before mean other code now (`Modules::remaps`).
    pub remaps: u64,
    /// The code generation the maps were read at (code_history.rs).
    pub code: CodeHistory,
}

impl Proc {
    /// A process with nothing read yet.
    pub fn new(generation: u64) -> Proc {
        Proc {
            maps: ProcessMaps::default(),
            reads: ReadPolicy::default(),
            generation,
            jit: JitCode::default(),
            remaps: 0,
            code: CodeHistory::default(),
        }
    }

    /// Its maps as `merged` left them, read at `now`; `generation`: theirs.
    pub fn read(&mut self, maps: ProcessMaps, merged: &Merged, generation: u64, now: Instant) {
        self.remaps += u64::from(merged.remapped);
        if merged.code_changed {
            self.reads.code_changed();
        }
        self.maps = maps;
        self.reads.read(now);
        self.generation = generation;
    }

    /// The process exec'ed: nothing of its old image is kept but its
    /// remaps. Returns the objects its maps held, for the caller to
    /// release.
    pub fn exec(&mut self) -> Vec<u32> {
        self.jit.clear();
        self.reads.exec();
        self.code = CodeHistory::default();
        self.maps.clear()
    }

    /// A child forked from this process at `now`: the same maps and JIT
    /// code (fork copies the address space), as if read then.
    pub fn fork(&self, generation: u64, now: Instant) -> Proc {
        Proc {
            maps: self.maps.clone(),
            reads: ReadPolicy::read_at(now),
            jit: self.jit.clone(),
            ..Proc::new(generation)
        }
    }

    /// Whether `addr` in a stack taken at `gen` may be named from the maps
    /// as read (no code mapped over it since; see code_history.rs).
    pub fn sure(&self, addr: u64, gen: Option<u32>) -> bool {
        gen.is_none_or(|gen| self.code.sure(addr, gen))
    }
}
