//! Stacks that print alike, merged at report time (see `same_frames`).

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::Arc,
};

use crate::profile::{Frame, StackReport};

/// A frame at an address in no mapped file (`[unknown]`, its offset the
/// raw address): the image it ran in was gone before its maps were read,
/// or it is JIT code.
fn is_unknown(f: &Frame) -> bool {
    f.module == "[unknown]"
}

/// Stacks of one process that name the same frames are one stack. The
/// collector keeps a stack per set of return addresses, and a process that
/// re-execs runs the same code at other addresses in each image (ASLR):
/// 101 quick images of one program gave 101 stacks, mostly hidden. Frames
/// at addresses in no mapped file (`[unknown]`: an image gone before its
/// maps were read, or JIT code) name nothing, so their addresses do not
/// keep stacks apart; a merged stack shows them without one. Counts,
/// series and rates add up.
pub(super) fn same_frames(mut out: Vec<StackReport>) -> Vec<StackReport> {
    // The first stack with each key, found with keys that borrow the
    // stacks: no allocation per stack (100 k stacks made 100 k key vectors).
    let first: Vec<usize> = {
        let mut seen: HashMap<Key<'_>, usize> = HashMap::with_capacity(out.len());
        out.iter()
            .enumerate()
            .map(|(i, s)| *seen.entry(Key(s)).or_insert(i))
            .collect()
    };
    // Compacted in place, in order: each first stack moves down to `kept`
    // (what it displaces was merged already), the others add into theirs.
    let mut at = vec![usize::MAX; out.len()];
    let mut kept = 0;
    let mut merged = Vec::new();
    for (i, &f) in first.iter().enumerate() {
        if f == i {
            out.swap(kept, i);
            at[i] = kept;
            kept += 1;
        } else {
            let into = at[f];
            let (head, tail) = out.split_at_mut(i);
            add_stack(&mut head[into], &tail[0]);
            merged.push(into);
        }
    }
    out.truncate(kept);
    for i in merged {
        let stack = &mut out[i];
        if stack.frames.iter().any(|f| is_unknown(f) && f.offset != 0) {
            stack.frames = stack
                .frames
                .iter()
                .map(|f| match is_unknown(f) {
                    true => Arc::new(Frame {
                        offset: 0,
                        ..Frame::clone(f)
                    }),
                    false => f.clone(),
                })
                .collect();
        }
    }
    out
}

/// What makes two stacks one: process, exited group, truncation, and
/// frames compared by identity (named frames are shared Arcs, one per file
/// and offset: cheap for 100 k stacks), every `[unknown]` frame alike.
struct Key<'a>(&'a StackReport);

impl Key<'_> {
    fn frames(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.frames.iter().map(|f| match is_unknown(f) {
            true => 0,
            false => Arc::as_ptr(f) as usize,
        })
    }
}

impl Hash for Key<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let s = self.0;
        (s.pid, s.start_time, &s.exited_group, s.truncated).hash(h);
        self.0.frames.len().hash(h);
        // The frames' addresses folded into one word first (our own
        // allocations, nothing a traced process chooses): SipHash over
        // every frame of 100 k stacks was most of the merge.
        let folded = self.frames().fold(0u64, |acc, f| {
            (acc.rotate_left(5) ^ f as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        });
        folded.hash(h);
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0, other.0);
        (a.pid, a.start_time, &a.exited_group, a.truncated)
            == (b.pid, b.start_time, &b.exited_group, b.truncated)
            && a.frames.len() == b.frames.len()
            && self.frames().eq(other.frames())
    }
}

impl Eq for Key<'_> {}

/// `from`'s numbers added to `into`'s (same stack, merged).
fn add_stack(into: &mut StackReport, from: &StackReport) {
    let (a, b) = (&mut into.counts, &from.counts);
    a.inuse_bytes += b.inuse_bytes;
    a.inuse_objects += b.inuse_objects;
    a.alloc_bytes += b.alloc_bytes;
    a.alloc_objects += b.alloc_objects;
    // One process: its stacks' values at its one peak add up.
    a.peak_inuse_bytes += b.peak_inuse_bytes;
    a.peak_inuse_objects += b.peak_inuse_objects;
    if let (Some(a), Some(b)) = (into.temporary.as_mut(), from.temporary) {
        a.add(b);
    }
    for (a, b) in into.series.iter_mut().zip(&from.series) {
        *a = a.saturating_add(*b);
    }
    into.growth_bytes_per_sec = match (into.growth_bytes_per_sec, from.growth_bytes_per_sec) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    if from.counts.inuse_bytes
        > into
            .counts
            .inuse_bytes
            .saturating_sub(from.counts.inuse_bytes)
    {
        into.trend = from.trend.or(into.trend);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::Counts;

    /// Frames as the names table gives them: one Arc per named frame.
    #[derive(Default)]
    struct Table(HashMap<(String, u64), Arc<Frame>>);

    impl Table {
        fn stack(&mut self, pid: u32, frames: &[(&str, u64)], bytes: u64) -> StackReport {
            let frames = frames
                .iter()
                .map(|&(function, offset)| {
                    let module = if function == "[unknown]" {
                        "[unknown]"
                    } else {
                        "/bin/p"
                    };
                    self.0
                        .entry((function.into(), offset))
                        .or_insert_with(|| {
                            Arc::new(Frame {
                                function: function.into(),
                                module: module.into(),
                                offset,
                                ..Frame::default()
                            })
                        })
                        .clone()
                })
                .collect();
            StackReport {
                pid,
                counts: Counts {
                    inuse_bytes: bytes,
                    inuse_objects: 1,
                    alloc_bytes: bytes,
                    alloc_objects: 1,
                    ..Counts::default()
                },
                frames,
                ..StackReport::default()
            }
        }
    }

    #[test]
    fn stacks_of_a_process_that_name_the_same_frames_are_one() {
        let mut t = Table::default();
        let stacks = vec![
            t.stack(7, &[("[unknown]", 0x5555_1000), ("main", 0x10)], 777),
            t.stack(7, &[("[unknown]", 0x5566_1000), ("main", 0x10)], 777),
            // Another process: kept apart.
            t.stack(8, &[("[unknown]", 0x5577_1000), ("main", 0x10)], 777),
            // Named, at two call sites: kept apart; the same site again
            // (another image): one.
            t.stack(7, &[("site", 0x20), ("main", 0x10)], 5),
            t.stack(7, &[("site", 0x24), ("main", 0x10)], 5),
            t.stack(7, &[("site", 0x20), ("main", 0x10)], 6),
        ];
        let merged = same_frames(stacks);
        assert_eq!(merged.len(), 4);
        assert_eq!(merged[0].counts.alloc_bytes, 2 * 777);
        assert_eq!(merged[0].counts.alloc_objects, 2);
        assert_eq!(merged[0].frames[0].offset, 0, "no meaningless address");
        assert_eq!(merged[1].pid, 8);
        assert_eq!(merged[1].frames[0].offset, 0x5577_1000, "alone: as it was");
        assert_eq!(merged[2].counts.alloc_bytes, 11);
        assert_eq!(merged[3].frames[0].offset, 0x24);
    }

    #[test]
    fn interleaved_stacks_merge_into_the_first_of_each_in_order() {
        let mut table = Table::default();
        let sites = [&[("a", 1)][..], &[("b", 2)][..], &[("c", 3)][..]];
        let order = [
            (0, 1),
            (1, 10),
            (0, 100),
            (2, 1_000),
            (1, 10_000),
            (0, 100_000),
        ];
        let stacks = order
            .iter()
            .map(|&(site, bytes)| table.stack(1, sites[site], bytes))
            .collect();
        let merged = same_frames(stacks);
        let got: Vec<(&str, u64, u64)> = merged
            .iter()
            .map(|s| {
                let counts = &s.counts;
                let function = s.frames[0].function.as_str();
                (function, counts.alloc_bytes, counts.alloc_objects)
            })
            .collect();
        assert_eq!(got, [("a", 100_101, 3), ("b", 10_010, 2), ("c", 1_000, 1)]);
    }
}
