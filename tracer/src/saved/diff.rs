//! `diff OLD NEW`: per-stack changes NEW − OLD.
//!
//! Stacks are matched by their symbolized frames (function names leaf to
//! root; the module's file name for frames that could not be named), not
//! by pid or address: two processes of one program, or two runs of it,
//! compare. Stacks of several processes with the same frames are summed.
//!
//! A stack is held as ids of its frames' names, one name per distinct
//! text: 4 bytes per frame reference, where a string per reference took
//! the name's length again for every stack that repeats it.

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use crate::report::{basename, Counts, Frame, Profile, PtrMap, StackReport, View};

mod write;

/// The diff document's version (`--format json`).
pub const DIFF_FORMAT: &str = "memtrace-bpf-diff/1";

/// Two profiles' stacks, matched.
pub struct Diff {
    pub old: Side,
    pub new: Side,
    /// Sorted by frames, each distinct stack once.
    pub entries: Vec<DiffEntry>,
    /// The frames' names, by id, in sorted order: ids compare as their
    /// names do.
    names: Vec<String>,
}

/// What the diff says of one input.
#[derive(Serialize)]
pub struct Side {
    /// The file, as given (raw: JSON keeps it exact, the other writers
    /// escape it).
    pub file: String,
    pub target: String,
    pub totals: Counts,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffEntry {
    /// Ids of the frames' names (`Diff::frames`), leaf first, as in
    /// reports.
    frames: Box<[u32]>,
    pub old: Counts,
    pub new: Counts,
}

/// NEW − OLD of each of the numbers.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Change {
    pub inuse_bytes: i64,
    pub inuse_objects: i64,
    pub alloc_bytes: i64,
    pub alloc_objects: i64,
    /// At the peaks (0 from a file saved before peaks were tracked).
    pub peak_inuse_bytes: i64,
    pub peak_inuse_objects: i64,
}

fn sub(new: u64, old: u64) -> i64 {
    let d = i128::from(new) - i128::from(old);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

impl Change {
    fn of(old: &Counts, new: &Counts) -> Change {
        Change {
            inuse_bytes: sub(new.inuse_bytes, old.inuse_bytes),
            inuse_objects: sub(new.inuse_objects, old.inuse_objects),
            alloc_bytes: sub(new.alloc_bytes, old.alloc_bytes),
            alloc_objects: sub(new.alloc_objects, old.alloc_objects),
            peak_inuse_bytes: sub(new.peak_inuse_bytes, old.peak_inuse_bytes),
            peak_inuse_objects: sub(new.peak_inuse_objects, old.peak_inuse_objects),
        }
    }

    /// Values in pprof's sample-type order (alloc objects, alloc space,
    /// inuse objects, inuse space, peak objects, peak space), as
    /// report/pprof.rs writes them.
    fn pprof_values(self) -> Vec<i64> {
        vec![
            self.alloc_objects,
            self.alloc_bytes,
            self.inuse_objects,
            self.inuse_bytes,
            self.peak_inuse_objects,
            self.peak_inuse_bytes,
        ]
    }
}

impl DiffEntry {
    pub fn change(&self, view: View) -> i64 {
        sub(view.value(&self.new), view.value(&self.old))
    }
}

/// The name a frame is matched by.
fn frame_key(f: &Frame) -> String {
    // Our pprof names unknown frames `[unknown] module+0xOFFSET`: match
    // those by module alone, as the JSON's `[unknown]` frames are.
    let unknown = f.is_unknown() || f.function.starts_with("[unknown]");
    if !unknown {
        return f.function.clone();
    }
    match f.module.as_str() {
        "" | "[unknown]" => "[unknown]".to_string(),
        module => format!("[unknown] {}", basename(module)),
    }
}

/// The names stacks are matched by, each once with an id; the ids of a
/// profile's frames by pointer (its frames are shared `Arc`s).
#[derive(Default)]
struct Keys {
    names: Vec<String>,
    by_name: HashMap<String, u32>,
}

impl Keys {
    fn intern(&mut self, name: String) -> u32 {
        if let Some(&id) = self.by_name.get(&name) {
            return id;
        }
        // 2^32 distinct names would take over 4 GiB of text alone.
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(name.clone());
        self.by_name.insert(name, id);
        id
    }

    fn stack(&mut self, s: &StackReport, frames: &mut PtrMap<u32>) -> Box<[u32]> {
        let mut key: Vec<u32> = s
            .frames
            .iter()
            .map(|f| match frames.get(&Arc::as_ptr(f)) {
                Some(&id) => id,
                None => {
                    let id = self.intern(frame_key(f));
                    frames.insert(Arc::as_ptr(f), id);
                    id
                }
            })
            .collect();
        if key.is_empty() {
            key.push(self.intern("[no stack]".into()));
        }
        if s.truncated {
            key.push(self.intern("[truncated]".into()));
        }
        key.into_boxed_slice()
    }

    /// The names sorted, and each old id's new one.
    fn sorted(self) -> (Vec<String>, Vec<u32>) {
        let mut order: Vec<u32> = (0..self.names.len() as u32).collect();
        order.sort_unstable_by(|&a, &b| self.names[a as usize].cmp(&self.names[b as usize]));
        let mut new_id = vec![0; order.len()];
        for (new, &old) in order.iter().enumerate() {
            new_id[old as usize] = new as u32;
        }
        let mut names = self.names;
        let names = order
            .iter()
            .map(|&old| std::mem::take(&mut names[old as usize]))
            .collect();
        (names, new_id)
    }
}

fn add(total: &mut Counts, c: &Counts) {
    total.inuse_bytes = total.inuse_bytes.saturating_add(c.inuse_bytes);
    total.inuse_objects = total.inuse_objects.saturating_add(c.inuse_objects);
    total.alloc_bytes = total.alloc_bytes.saturating_add(c.alloc_bytes);
    total.alloc_objects = total.alloc_objects.saturating_add(c.alloc_objects);
    total.peak_inuse_bytes = total.peak_inuse_bytes.saturating_add(c.peak_inuse_bytes);
    total.peak_inuse_objects = total
        .peak_inuse_objects
        .saturating_add(c.peak_inuse_objects);
}

impl Diff {
    /// Matches the stacks of `old` and `new`; `old_file` and `new_file`
    /// name them in the output.
    pub fn new(old: &Profile, new: &Profile, old_file: &str, new_file: &str) -> Diff {
        let mut keys = Keys::default();
        let mut map: HashMap<Box<[u32]>, (Counts, Counts)> = HashMap::new();
        let mut frames = PtrMap::default();
        for s in &old.stacks {
            add(
                &mut map.entry(keys.stack(s, &mut frames)).or_default().0,
                &s.counts,
            );
        }
        // The other profile's frames are other Arcs.
        let mut frames = PtrMap::default();
        for s in &new.stacks {
            add(
                &mut map.entry(keys.stack(s, &mut frames)).or_default().1,
                &s.counts,
            );
        }
        drop(frames);
        let (names, new_id) = keys.sorted();
        let mut entries: Vec<DiffEntry> = map
            .into_iter()
            .map(|(mut frames, (old, new))| {
                frames.iter_mut().for_each(|id| *id = new_id[*id as usize]);
                DiffEntry { frames, old, new }
            })
            .collect();
        // Ids are in name order: this is the order of the names.
        entries.sort_unstable_by(|a, b| a.frames.cmp(&b.frames));
        let side = |p: &Profile, file: &str| Side {
            file: file.to_string(),
            target: p.target.clone(),
            totals: p.totals,
        };
        Diff {
            old: side(old, old_file),
            new: side(new, new_file),
            entries,
            names,
        }
    }

    /// The names of `e`'s frames, leaf first.
    pub fn frames<'a>(
        &'a self,
        e: &'a DiffEntry,
    ) -> impl DoubleEndedIterator<Item = &'a str> + ExactSizeIterator {
        e.frames.iter().map(|&id| self.names[id as usize].as_str())
    }

    /// Entries whose `view` changed, largest absolute change first (ties
    /// by frames, so the order is stable).
    pub fn ranked(&self, view: View) -> Vec<&DiffEntry> {
        let mut v: Vec<&DiffEntry> = self
            .entries
            .iter()
            .filter(|e| e.change(view) != 0)
            .collect();
        v.sort_by(|a, b| {
            b.change(view)
                .unsigned_abs()
                .cmp(&a.change(view).unsigned_abs())
                .then_with(|| a.frames.cmp(&b.frames))
        });
        v
    }
}
