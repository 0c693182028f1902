//! One process's file-backed mappings and the object of each, as its
//! /proc/PID/maps reads left them: each read is merged into what was
//! known, and a merge says whether other code now lies where code was (a
//! remap: a library unloaded and another loaded in its place).
//!
//! Pure: objects are found by the caller's `identify`, and their
//! refcounts are the caller's (`Merged::released`).

use std::collections::HashMap;

use crate::tracee::process::Mapping;

/// File-backed mappings sorted by start, and the object of each.
#[derive(Clone, Debug, Default)]
pub struct ProcessMaps {
    maps: Vec<Mapping>,
    /// The object of each mapping (same index as `maps`).
    objects: Vec<u32>,
}

/// What a merge changed.
#[derive(Debug, Default)]
pub struct Merged {
    /// The objects of the maps before the merge (one entry per mapping):
    /// the caller releases them once it retained those of the new maps.
    pub released: Vec<u32>,
    /// The mappings differ (what was built from them is to be rebuilt).
    pub maps_changed: bool,
    /// The mappings or their objects differ (the kernel's walker is to be
    /// told).
    pub changed: bool,
    /// The executable mappings or their objects differ.
    pub code_changed: bool,
    /// Other code where known code was.
    pub remapped: bool,
}

/// Where a mapping's file would start in memory: a file mapped again at
/// the same place (split by mprotect, say) keeps it.
fn load_bias(m: &Mapping) -> u64 {
    m.start.wrapping_sub(m.offset)
}

/// The executable mappings of a process and their objects.
fn code<'a>(
    maps: &'a [Mapping],
    objects: &'a [u32],
) -> impl Iterator<Item = (&'a Mapping, &'a u32)> {
    maps.iter().zip(objects).filter(|(m, _)| m.executable)
}

impl ProcessMaps {
    pub fn maps(&self) -> &[Mapping] {
        &self.maps
    }

    /// The object of each mapping (same index as `maps`).
    pub fn objects(&self) -> &[u32] {
        &self.objects
    }

    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Forgets every mapping (an exec); returns their objects, for the
    /// caller to release.
    pub fn clear(&mut self) -> Vec<u32> {
        self.maps.clear();
        std::mem::take(&mut self.objects)
    }

    /// The index of the mapping holding `addr`.
    pub fn find_index(&self, addr: u64) -> Option<usize> {
        let i = self
            .maps
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        self.maps.get(i).filter(|m| addr < m.end).map(|_| i)
    }

    /// The mapping holding `addr` and its object.
    pub fn find(&self, addr: u64) -> Option<(&Mapping, u32)> {
        let i = self.find_index(addr)?;
        Some((self.maps.get(i)?, *self.objects.get(i)?))
    }

    /// Merges freshly read maps into what is known: known mappings that
    /// nothing new overlaps stay. A re-read is for a library loaded since
    /// (dlopen); if the process exec'ed meanwhile, events of its old image
    /// still in the ring buffer (the EXEC event comes after them, then the
    /// maps are cleared) are resolved with the old mappings, not with the
    /// new image's. A new mapping's object is `identify`'s, called once
    /// per path, and only for mappings that are not unchanged.
    pub fn merge(
        &mut self,
        new: Vec<Mapping>,
        mut identify: impl FnMut(&Mapping) -> u32,
    ) -> Merged {
        let old_maps = std::mem::take(&mut self.maps);
        let old_objects = std::mem::take(&mut self.objects);
        let mut merged: Vec<(Mapping, u32)> = Vec::with_capacity(new.len() + old_maps.len());
        // Known mappings that nothing new overlaps stay (cloned: the old
        // list is compared with the result below).
        for (o, &object) in old_maps.iter().zip(&old_objects) {
            if !new.iter().any(|n| n.start < o.end && o.start < n.end) {
                merged.push((o.clone(), object));
            }
        }
        let mut opened: HashMap<String, u32> = HashMap::new();
        let mut remapped = false;
        for m in new {
            let object = match unchanged(&old_maps, &m) {
                Some(i) => old_objects[i],
                None => match opened.get(&m.path) {
                    Some(&o) => o,
                    None => {
                        let o = identify(&m);
                        opened.insert(m.path.clone(), o);
                        o
                    }
                },
            };
            // Other code where known code was (a library unloaded and
            // another loaded in its place): a remap. Only code counts:
            // no return address lies in data, and a data file mapped where
            // another was (databases, locales) is common.
            remapped |= m.executable
                && old_maps.iter().zip(&old_objects).any(|(o, &old)| {
                    o.executable
                        && o.start < m.end
                        && m.start < o.end
                        && (old != object || load_bias(o) != load_bias(&m))
                });
            merged.push((m, object));
        }
        merged.sort_by_key(|(m, _)| m.start);
        (self.maps, self.objects) = merged.into_iter().unzip();
        Merged {
            maps_changed: self.maps != old_maps,
            changed: self.maps != old_maps || self.objects != old_objects,
            code_changed: !code(&self.maps, &self.objects).eq(code(&old_maps, &old_objects)),
            remapped,
            released: old_objects,
        }
    }
}

/// The index in `old` (sorted by start) of a mapping equal to `m`: an
/// unchanged mapping keeps its object, with no open and no stat.
fn unchanged(old: &[Mapping], m: &Mapping) -> Option<usize> {
    let at = old.partition_point(|o| o.start < m.start);
    old.get(at..)
        .unwrap_or_default()
        .iter()
        .take_while(|o| o.start == m.start)
        .position(|o| o == m)
        .map(|i| at + i)
}

#[cfg(test)]
mod tests;
