//! A process's return addresses turned into (object, file offset) or (JIT
//! function, offset in it) from its maps as read: the same code gives the
//! same frame in every process that maps it, and keeps its name after the
//! process exited.

use super::{jit_frames::JitFrames, objects::ObjectTable, process::Proc};

/// A return address turned into (module, file offset of `ip - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormFrame {
    /// Index into the object table (one entry per file, not per process),
    /// or from `jit::JIT_MODULE` up a JIT function's name (`jit_name`);
    /// None when the address is in no mapped file and has no JIT name (or
    /// the maps changed or the process exited before we looked).
    pub module: Option<u32>,
    /// File offset in the module, offset in the JIT function, or the raw
    /// address when `module` is None.
    pub offset: u64,
}

/// Stacks with frames left unnamed because other code was mapped at
/// their address after the stack was taken, before the maps were read;
/// and stacks older than the kernel side's history of mappings reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    pub replaced: u64,
    pub beyond_history: u64,
}

/// What naming one process's frames reads and marks.
pub struct Normalizer<'a> {
    pub pid: u32,
    /// None: the process is not known (its frames stay raw addresses).
    pub proc: Option<&'a Proc>,
    pub objects: &'a mut ObjectTable,
    pub jit: &'a mut JitFrames,
}

impl Normalizer<'_> {
    /// Normalizes return addresses taken at code generation `gen` (None:
    /// not known, named from the maps as read). An address where other
    /// code was mapped since the stack was taken stays unnamed (counted).
    pub fn stack(
        &mut self,
        return_addrs: &[u64],
        gen: Option<u32>,
        stats: &mut CodeStats,
    ) -> Vec<NormFrame> {
        if let (Some(gen), Some(p)) = (gen, self.proc) {
            stats.beyond_history += u64::from(!p.code.reaches(gen));
        }
        let mut replaced = false;
        let frames = return_addrs
            .iter()
            .map(|&ret| {
                let addr = ret.saturating_sub(1);
                if self.proc.is_none_or(|p| p.sure(addr, gen)) {
                    self.frame(addr)
                } else {
                    replaced = true;
                    raw(addr)
                }
            })
            .collect();
        stats.replaced += u64::from(replaced);
        frames
    }

    /// The frame of one address: in a mapped file, (its object, file
    /// offset), the object then kept for the report; else `jit_frame`.
    fn frame(&mut self, addr: u64) -> NormFrame {
        let Some((m, object)) = self.proc.and_then(|p| p.maps.find(addr)) else {
            return self.jit_frame(addr);
        };
        self.objects.reference(object);
        NormFrame {
            module: Some(object),
            offset: addr - m.start + m.offset,
        }
    }

    /// An address in no mapped file: JIT code named by the process's perf
    /// map or jitdump becomes (its name, offset in it); anything else stays
    /// a raw address.
    fn jit_frame(&mut self, addr: u64) -> NormFrame {
        let Some(p) = self.proc else {
            return raw(addr);
        };
        match self.jit.name(self.pid, addr, p.maps.maps()) {
            Some((module, offset)) => NormFrame {
                module: Some(module),
                offset,
            },
            None => raw(addr),
        }
    }

    /// `frames` with the addresses in no file named from the JIT's files
    /// if they have a name now; None when none has.
    pub fn name_jit(&mut self, frames: &[NormFrame]) -> Option<Vec<NormFrame>> {
        let mut out = frames.to_vec();
        let mut named = false;
        for f in out.iter_mut().filter(|f| f.module.is_none()) {
            let n = self.jit_frame(f.offset);
            named |= n.module.is_some();
            *f = n;
        }
        named.then_some(out)
    }
}

/// An address left as it is.
fn raw(addr: u64) -> NormFrame {
    NormFrame {
        module: None,
        offset: addr,
    }
}

#[cfg(test)]
mod tests;
