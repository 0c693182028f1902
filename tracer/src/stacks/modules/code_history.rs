//! What code a process mapped when, so that a frame is named from the
//! file that was mapped when its stack was taken. The kernel side keeps
//! each traced process's code generation (tracer-ebpf code_gen.rs): it
//! goes up at every file the process maps executable, with the range
//! remembered, and every stack carries the generation it was taken under.
//! The maps are read at some generation r; an address of a stack taken at
//! generation g < r may be named from them only if no code was mapped over
//! it in between (a plugin unloaded and another loaded at its address).
//! Such a frame is left unnamed instead, and counted.

use aya::maps::{HashMap as BpfHashMap, MapData};
use tracer_common::{CodeMaps, CodeRange};

/// The kernel side's generations (a trait so that the rooms using it are
/// tested without BPF).
pub trait CodeGens {
    /// `pid`'s generation and last executable mappings now (None: it
    /// mapped none since its maps were first read).
    fn current(&self, pid: u32) -> Option<CodeMaps>;
    /// User space read `pid`'s maps at generation `gen`: from now on the
    /// kernel side counts its mappings, and walks at `gen` trust the
    /// tables described from that read.
    fn read_at(&mut self, pid: u32, gen: u32);
    /// `pid` exited: its entries go.
    fn forget(&mut self, pid: u32);
}

/// `CodeGens` over the BPF maps MAPS_GEN and MAPS_READ.
pub struct BpfCodeGens {
    gens: BpfHashMap<MapData, u32, CodeMaps>,
    read: BpfHashMap<MapData, u32, u32>,
}

impl BpfCodeGens {
    pub fn new(gens: aya::maps::Map, read: aya::maps::Map) -> anyhow::Result<BpfCodeGens> {
        Ok(BpfCodeGens {
            gens: BpfHashMap::try_from(gens)?,
            read: BpfHashMap::try_from(read)?,
        })
    }
}

impl CodeGens for BpfCodeGens {
    fn current(&self, pid: u32) -> Option<CodeMaps> {
        self.gens.get(&pid, 0).ok()
    }

    fn read_at(&mut self, pid: u32, gen: u32) {
        // A full map (more processes than it holds): this process's
        // stacks are named from the maps as read, as without generations.
        let _ = self.read.insert(pid, gen, 0);
    }

    fn forget(&mut self, pid: u32) {
        let _ = self.read.remove(&pid);
        let _ = self.gens.remove(&pid);
    }
}

/// /proc/PID/maps and the code generation they show: read again (at most
/// 3 times) while the process maps code meanwhile.
pub fn read_maps(pid: u32, gens: Option<&dyn CodeGens>) -> Option<(Vec<u8>, Option<CodeMaps>)> {
    let current = |pid| gens.and_then(|g| g.current(pid));
    let mut before = current(pid);
    let mut attempt = 0;
    loop {
        let text = std::fs::read(format!("/proc/{pid}/maps")).ok()?;
        let after = current(pid);
        attempt += 1;
        if after.map(|m| m.gen) == before.map(|m| m.gen) || attempt == 3 {
            return Some((text, after));
        }
        before = after;
    }
}

/// Whether generation `a` comes after `b` (they only go up, by one per
/// mapping; compared as a wrapping difference).
pub fn newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// A process's maps as last read: the generation they were read at and
/// the executable mappings the kernel side remembered then.
#[derive(Clone, Debug, Default)]
pub struct CodeHistory {
    read_gen: u32,
    /// At most tracer_common::CODE_HISTORY.
    ranges: Vec<CodeRange>,
    /// The newest generation whose stack asked for the maps to be read
    /// again (`wants_read`), so that one generation costs one read.
    asked: u32,
}

impl CodeHistory {
    /// The history of a read made at `maps`' generation (None: 0).
    pub fn at_read(maps: Option<&CodeMaps>) -> CodeHistory {
        let Some(maps) = maps else {
            return CodeHistory::default();
        };
        let ranges = maps
            .ranges
            .iter()
            .filter(|r| r.gen != 0 && !newer(r.gen, maps.gen))
            .copied()
            .collect();
        CodeHistory {
            read_gen: maps.gen,
            ranges,
            asked: maps.gen,
        }
    }

    pub fn read_gen(&self) -> u32 {
        self.read_gen
    }

    /// A stack taken at `gen`: true the first time a generation newer than
    /// the read's is seen (the process mapped code since: read again).
    pub fn wants_read(&mut self, gen: u32) -> bool {
        if newer(gen, self.read_gen) && newer(gen, self.asked) {
            self.asked = gen;
            return true;
        }
        false
    }

    /// Whether `addr`, in a stack taken at `gen`, may be named from the
    /// maps as read: no code was mapped over it after `gen`, up to the
    /// read. (A stack newer than the read is named from it: the read
    /// after it failed, the process being gone.)
    pub fn sure(&self, addr: u64, gen: u32) -> bool {
        if !newer(self.read_gen, gen) {
            return true; // nothing remembered is newer than the stack
        }
        !self
            .ranges
            .iter()
            .any(|r| newer(r.gen, gen) && addr >= r.start && addr - r.start < u64::from(r.len))
    }

    /// Whether the history reaches back to `gen`: with more than
    /// CODE_HISTORY mappings since, the oldest are forgotten and `sure`
    /// may miss one.
    pub fn reaches(&self, gen: u32) -> bool {
        !newer(self.read_gen, gen)
            || self.read_gen.wrapping_sub(gen) as usize <= tracer_common::CODE_HISTORY
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::CODE_HISTORY;

    fn maps(gen: u32, ranges: &[(u64, u32, u32)]) -> CodeMaps {
        let mut m = CodeMaps {
            gen,
            _pad: 0,
            ranges: [CodeRange::default(); CODE_HISTORY],
        };
        for &(start, len, gen) in ranges {
            m.ranges[gen as usize % CODE_HISTORY] = CodeRange { start, len, gen };
        }
        m
    }

    #[test]
    fn a_frame_is_unsure_only_where_code_was_mapped_after_its_stack() {
        // Library A mapped at generation 1 at 0x1000, library C at 2
        // elsewhere, then B at 3 where A was; the maps read at 3.
        let h = CodeHistory::at_read(Some(&maps(
            3,
            &[
                (0x1000, 0x1000, 1),
                (0x8000, 0x1000, 2),
                (0x1000, 0x1000, 3),
            ],
        )));
        // A stack of A's time (generation 1 or 2): its frame at A's
        // address may be A's or B's.
        assert!(!h.sure(0x1800, 1));
        assert!(!h.sure(0x1800, 2));
        // C's frames are C's whatever the stack's generation after 2.
        assert!(h.sure(0x8800, 2));
        // A stack taken once B was mapped is named from the read.
        assert!(h.sure(0x1800, 3));
        // Code mapped before any of these is the same at every generation.
        assert!(h.sure(0x40_0000, 0));
        // Just past a range is outside it.
        assert!(h.sure(0x2000, 1));
    }

    #[test]
    fn a_newer_generation_asks_for_one_read() {
        let mut h = CodeHistory::at_read(Some(&maps(5, &[])));
        assert!(!h.wants_read(5));
        assert!(!h.wants_read(4));
        assert!(h.wants_read(6));
        assert!(!h.wants_read(6), "asked once per generation");
        assert!(h.wants_read(7));
        assert!(!CodeHistory::default().wants_read(0));
    }

    #[test]
    fn generations_compare_across_the_wrap() {
        assert!(newer(1, 0));
        assert!(newer(0, u32::MAX));
        assert!(!newer(u32::MAX, 0));
        let h = CodeHistory::at_read(Some(&maps(3, &[(0x1000, 0x100, 3)])));
        assert!(h.reaches(1));
        assert!(!h.reaches(3u32.wrapping_sub(CODE_HISTORY as u32 + 1)));
    }
}
