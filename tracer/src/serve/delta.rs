//! `/debug/pprof/allocs?seconds=N`: what was allocated between two
//! snapshots, as Go's `net/http/pprof` answers a delta.

use std::collections::HashMap;

use crate::report::{Counts, Note, Profile, StackReport};

/// A stack's identity across snapshots: its process and its frames.
type Key<'a> = (u32, Option<u64>, bool, Vec<(&'a str, u64, &'a str)>);

fn key(s: &StackReport) -> Key<'_> {
    let frames = s
        .frames
        .iter()
        .map(|f| (f.module.as_str(), f.offset, f.function.as_str()))
        .collect();
    (s.pid, s.start_time, s.truncated, frames)
}

/// `after` with its allocated counts reduced to what was allocated since
/// `before`. In-use counts stay those of `after` (the heap at the end of
/// the window): pprof's unsigned values cannot say "freed in the window".
/// Stacks that allocated nothing in the window are left out.
pub fn between(before: &Profile, after: &Profile, seconds: u64) -> Profile {
    let earlier: HashMap<Key<'_>, Counts> =
        before.stacks.iter().map(|s| (key(s), s.counts)).collect();
    let mut delta = after.clone();
    delta.stacks.retain_mut(|s| {
        if let Some(old) = earlier.get(&key(s)).copied() {
            s.counts.alloc_bytes = s.counts.alloc_bytes.saturating_sub(old.alloc_bytes);
            s.counts.alloc_objects = s.counts.alloc_objects.saturating_sub(old.alloc_objects);
        }
        s.counts.alloc_objects > 0
    });
    delta.totals.alloc_bytes = delta.stacks.iter().map(|s| s.counts.alloc_bytes).sum();
    delta.totals.alloc_objects = delta.stacks.iter().map(|s| s.counts.alloc_objects).sum();
    delta.totals.inuse_bytes = delta.stacks.iter().map(|s| s.counts.inuse_bytes).sum();
    delta.totals.inuse_objects = delta.stacks.iter().map(|s| s.counts.inuse_objects).sum();
    delta.totals.peak_inuse_bytes = delta.stacks.iter().map(|s| s.counts.peak_inuse_bytes).sum();
    delta.totals.peak_inuse_objects = delta
        .stacks
        .iter()
        .map(|s| s.counts.peak_inuse_objects)
        .sum();
    delta.duration_secs = seconds as f64;
    delta.notes.push(Note::Delta { seconds });
    delta
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::report::Frame;

    fn stack(function: &str, alloc_bytes: u64, inuse_bytes: u64) -> StackReport {
        StackReport {
            pid: 7,
            counts: Counts {
                inuse_bytes,
                inuse_objects: inuse_bytes / 16,
                alloc_bytes,
                alloc_objects: alloc_bytes / 16,
                ..Counts::default()
            },
            frames: vec![Arc::new(Frame {
                function: function.into(),
                module: "/bin/t".into(),
                ..Frame::default()
            })]
            .into(),
            ..StackReport::default()
        }
    }

    #[test]
    fn only_what_was_allocated_in_the_window() {
        let before = Profile {
            stacks: vec![stack("old", 160, 160), stack("grows", 320, 0)],
            ..Profile::default()
        };
        let after = Profile {
            stacks: vec![
                stack("old", 160, 160),
                stack("grows", 800, 48),
                stack("new", 64, 64),
            ],
            ..Profile::default()
        };
        let d = between(&before, &after, 5);
        let got: Vec<(&str, u64, u64, u64)> = d
            .stacks
            .iter()
            .map(|s| {
                (
                    s.frames[0].function.as_str(),
                    s.counts.alloc_bytes,
                    s.counts.alloc_objects,
                    s.counts.inuse_bytes,
                )
            })
            .collect();
        assert_eq!(got, [("grows", 480, 30, 48), ("new", 64, 4, 64)]);
        assert_eq!((d.totals.alloc_bytes, d.totals.inuse_bytes), (544, 112));
        assert_eq!(d.duration_secs, 5.0);
    }
}
