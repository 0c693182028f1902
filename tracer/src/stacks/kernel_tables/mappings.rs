//! Each process's entries in UNWIND_MAPPINGS: which table and load
//! address apply to each of its executable mappings, as trie keys.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
};

use tracer_common::{MappingKey, MappingValue, MAPPING_FP_ONLY, MAPPING_TABLE};

use super::{FileId, FileTable, KernelTables, PrefixKey, ProcEntries};
use crate::{
    stacks::{cfi::load_bias, trampolines::JitCode},
    tracee::process::Mapping,
};

impl KernelTables {
    /// Describes `pid`'s executable mappings to the walker: `maps` and
    /// `objects` as `Modules` holds them (same index), `open` gives an
    /// object's identity and a path to read it from (None: no table).
    /// `jit`: anonymous executable ranges, walked by frame pointers but
    /// for the CPython trampolines found in them.
    pub fn sync(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        objects: &[u32],
        jit: &JitCode,
        open: impl Fn(u32) -> Option<(FileId, PathBuf)>,
    ) {
        let mut want: HashMap<PrefixKey, MappingValue> = HashMap::new();
        let old = self.procs.remove(&pid).unwrap_or_default();
        let mut shapes = BTreeSet::new();
        self.jit_entries(pid, jit, &mut shapes, &mut want);
        // Each file used is acquired (its users counted) as soon as it is
        // met, so that a table built later in this sync cannot evict it.
        let mut used = BTreeSet::new();
        for (m, &object) in maps.iter().zip(objects) {
            if !m.executable || m.start >= m.end {
                continue;
            }
            let value = match open(object) {
                Some((id, path)) => {
                    if used.insert(id) {
                        self.acquire(id, &path, !old.objects.contains(&id));
                    }
                    match self.files.get(&id) {
                        Some(file) => mapping_value(file, m),
                        None => fp_only(),
                    }
                }
                None => fp_only(),
            };
            for key in prefixes(pid, m.start, m.end) {
                want.insert(key, value);
            }
        }
        for (key, value) in &old.entries {
            if want.get(key) != Some(value) {
                let _ = self.maps.remove_mapping(*key);
            }
        }
        let mut entries = HashMap::with_capacity(want.len());
        let mut changed = old.entries.keys().any(|k| !want.contains_key(k));
        for (key, value) in want {
            if old.entries.get(&key) != Some(&value) {
                changed = true;
                if self.maps.insert_mapping(key, value).is_err() {
                    self.stats.mappings_full += 1;
                    continue;
                }
            }
            entries.insert(key, value);
        }
        if changed {
            let _ = self.maps.changed();
        }
        for object in old.objects {
            self.release(object);
        }
        for shape in old.shapes {
            self.release_shape(shape);
        }
        self.procs.insert(
            pid,
            ProcEntries {
                entries,
                objects: used,
                shapes,
            },
        );
    }

    /// The process exited or exec'ed: its mappings go; the tables no other
    /// process uses are kept unused.
    pub fn drop_process(&mut self, pid: u32) {
        let Some(old) = self.procs.remove(&pid) else {
            return;
        };
        for key in old.entries.keys() {
            let _ = self.maps.remove_mapping(*key);
        }
        if !old.entries.is_empty() {
            let _ = self.maps.changed();
        }
        for object in old.objects {
            self.release(object);
        }
        for shape in old.shapes {
            self.release_shape(shape);
        }
    }
}

/// A range walked by the frame-pointer chain (JIT code, files without CFI).
pub(super) fn fp_only() -> MappingValue {
    MappingValue {
        kind: MAPPING_FP_ONLY,
        ..MappingValue::default()
    }
}

/// The walker's view of one executable mapping of `file`.
fn mapping_value(file: &FileTable, m: &Mapping) -> MappingValue {
    let fp_only = fp_only();
    let (Some((first_row, rows, base)), Some(bias)) = (file.rows, load_bias(&file.loads, m)) else {
        return fp_only;
    };
    MappingValue {
        load_base: bias.wrapping_add(base),
        first_row,
        rows,
        kind: MAPPING_TABLE,
        _pad: 0,
    }
}

/// The trie keys covering [start, end) of process `pid`: the largest
/// aligned power-of-two blocks, at most two per address bit.
pub fn prefixes(pid: u32, start: u64, end: u64) -> Vec<PrefixKey> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let mut bits = at.trailing_zeros().min(63);
        while bits > 0 && at.checked_add(1 << bits).is_none_or(|e| e > end) {
            bits -= 1;
        }
        out.push(PrefixKey {
            prefix_len: 32 + (64 - bits),
            key: MappingKey::new(pid, at),
        });
        at += 1 << bits;
    }
    out
}
