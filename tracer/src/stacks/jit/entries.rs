//! One process's JIT symbols: address ranges and their names. A JIT reuses
//! addresses (code freed, moved, recompiled), so an entry replaces the
//! parts of older entries it covers: the latest entry covering an address
//! wins, and the entries never overlap.

use std::{collections::BTreeMap, ops::Range};

/// Entries kept per process: node's map of a large application holds tens
/// of thousands; a process writing more keeps its first ones.
pub const MAX_ENTRIES: usize = 200_000;
/// Bytes of names kept per process (names of replaced entries included:
/// the arena only grows, so this also bounds what a process rewriting its
/// map over and over costs).
pub const MAX_NAME_BYTES: usize = 16 << 20;

#[derive(Default)]
pub struct Entries {
    /// start → (end, the name's bytes in `names`).
    map: BTreeMap<u64, (u64, Range<u32>)>,
    names: String,
}

impl Entries {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Records `[start, end)` named `name`. False (nothing recorded) when
    /// a cap is reached or the range is empty.
    pub fn insert(&mut self, start: u64, end: u64, name: &str) -> bool {
        // One insert adds at most two entries (itself and the right part
        // of an older entry it splits).
        if start >= end
            || self.map.len() + 2 > MAX_ENTRIES
            || self.names.len() + name.len() > MAX_NAME_BYTES
        {
            return false;
        }
        let mut right: Option<(u64, u64, Range<u32>)> = None;
        // Entries never overlap, so only the last one starting before
        // `start` can reach into the new range.
        if let Some((&s, (e, n))) = self.map.range(..start).next_back() {
            let (e, n) = (*e, n.clone());
            if e > start {
                if e > end {
                    right = Some((end, e, n.clone()));
                }
                self.map.insert(s, (start, n));
            }
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            if let Some((e, n)) = self.map.remove(&s) {
                if e > end {
                    right = Some((end, e, n));
                }
            }
        }
        if let Some((s, e, n)) = right {
            self.map.insert(s, (e, n));
        }
        let at = self.names.len() as u32;
        self.names.push_str(name);
        self.map.insert(start, (end, at..self.names.len() as u32));
        true
    }

    /// The entry covering `addr`: its start and name.
    pub fn lookup(&self, addr: u64) -> Option<(u64, &str)> {
        let (&start, (end, name)) = self.map.range(..=addr).next_back()?;
        let name = self.names.get(name.start as usize..name.end as usize)?;
        (addr < *end).then_some((start, name))
    }
}
