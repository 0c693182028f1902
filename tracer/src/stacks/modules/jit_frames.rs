//! Names of JIT frames: each live process's JIT symbol tables (its perf
//! map and jitdump files, `jit.rs`), read when first needed and dropped
//! when it execs or exits, and the names that interned frames hold, each
//! once for the whole trace (capped in `JitNames`).

use super::super::jit::{JitNames, JitStats, JitSymbols};
use crate::{hashing::FastMap, tracee::process::Mapping};

/// The module JIT frames show, like the bracketed names /proc/PID/maps
/// gives memory that is no file (`[vdso]`, `[heap]`): the same in every
/// process, so one program's processes share their JIT frames.
pub const JIT_MODULE_PATH: &str = "[jit]";

#[derive(Default)]
pub struct JitFrames {
    /// Per live process whose JIT code was looked up.
    symbols: FastMap<u32, JitSymbols>,
    /// Names of the JIT frames that stacks hold (module ids from JIT_MODULE).
    names: JitNames,
    stats: JitStats,
}

impl JitFrames {
    /// The JIT function of `pid` holding `addr`, as (its module id, the
    /// offset of `addr` in it), when the process's files name it. `maps`:
    /// its file mappings, in which jitdump files show.
    pub fn name(&mut self, pid: u32, addr: u64, maps: &[Mapping]) -> Option<(u32, u64)> {
        let symbols = self.symbols.entry(pid).or_default();
        let (start, name) = symbols.lookup(pid, addr, maps, &mut self.stats)?;
        Some((self.names.intern(name)?, addr - start))
    }

    /// Reads what `pid`'s JIT files gained, now (no rate limit).
    pub fn read_now(&mut self, pid: u32, maps: &[Mapping]) {
        let symbols = self.symbols.entry(pid).or_default();
        symbols.read(pid, maps, &mut self.stats);
    }

    /// `pid` exec'ed or exited: its tables go (interned names stay).
    pub fn forget(&mut self, pid: u32) {
        self.symbols.remove(&pid);
    }

    /// The function name of a JIT frame's module id (None: an object).
    pub fn name_of(&self, module: u32) -> Option<&str> {
        self.names.get(module)
    }

    /// The JIT name files read over the trace (summed over processes) and
    /// the frames left unnamed at the interning cap.
    pub fn stats(&self) -> (JitStats, u64) {
        (self.stats, self.names.refused)
    }
}
