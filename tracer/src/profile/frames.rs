//! A stack's frames: a slice of one list that all the stacks of a report
//! share. 100 k stacks built as 100 k vectors cost 100 k allocations, and
//! each allocation of the tracer's own can hit other tracers' uprobes on
//! malloc (seconds at that count on a busy machine); one list for all of
//! them is a handful of allocations.

use std::{
    fmt,
    ops::{Deref, DerefMut, Range},
    sync::Arc,
};

use serde::{Serialize, Serializer};

use super::Frame;

/// Leaf first (see `StackReport::frames`). Reads as a slice; changed in
/// place (tests), it copies the shared list first.
#[derive(Clone, Default)]
pub struct Frames {
    all: Arc<Vec<Arc<Frame>>>,
    /// Where this stack's frames are in `all`.
    at: Range<usize>,
}

impl Frames {
    /// The stacks whose frames are `ranges` of `all`, in order.
    pub fn share(all: Vec<Arc<Frame>>, ranges: Vec<Range<usize>>) -> impl Iterator<Item = Frames> {
        let all = Arc::new(all);
        ranges.into_iter().map(move |at| {
            debug_assert!(at.end <= all.len());
            Frames {
                all: Arc::clone(&all),
                at,
            }
        })
    }
}

impl Frames {
    /// The stack whose frames are `at` in `all`, a list other stacks share.
    pub fn part(all: &Arc<Vec<Arc<Frame>>>, at: Range<usize>) -> Frames {
        debug_assert!(at.end <= all.len());
        Frames {
            all: Arc::clone(all),
            at,
        }
    }
}

impl Deref for Frames {
    type Target = [Arc<Frame>];

    fn deref(&self) -> &[Arc<Frame>] {
        &self.all[self.at.clone()]
    }
}

impl DerefMut for Frames {
    fn deref_mut(&mut self) -> &mut [Arc<Frame>] {
        // Its own list first: the other stacks keep theirs as they were.
        if Arc::strong_count(&self.all) > 1 || self.at != (0..self.all.len()) {
            *self = Frames::from(self.to_vec());
        }
        let at = self.at.clone();
        &mut Arc::make_mut(&mut self.all)[at]
    }
}

impl From<Vec<Arc<Frame>>> for Frames {
    fn from(frames: Vec<Arc<Frame>>) -> Frames {
        Frames {
            at: 0..frames.len(),
            all: Arc::new(frames),
        }
    }
}

impl FromIterator<Arc<Frame>> for Frames {
    fn from_iter<I: IntoIterator<Item = Arc<Frame>>>(iter: I) -> Frames {
        Frames::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl PartialEq for Frames {
    fn eq(&self, other: &Frames) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Frames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As the list of frames it reads as.
impl Serialize for Frames {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str) -> Arc<Frame> {
        Arc::new(Frame {
            function: function.into(),
            ..Frame::default()
        })
    }

    #[test]
    fn stacks_read_their_own_part_of_the_shared_list() {
        let all = vec![frame("a"), frame("main"), frame("b"), frame("main")];
        let stacks: Vec<Frames> = Frames::share(all, vec![0..2, 2..4, 4..4]).collect();
        let names = |f: &Frames| f.iter().map(|f| f.function.clone()).collect::<Vec<_>>();
        assert_eq!(names(&stacks[0]), ["a", "main"]);
        assert_eq!(names(&stacks[1]), ["b", "main"]);
        assert!(stacks[2].is_empty());
        assert_eq!(
            serde_json::to_string(&stacks[1]).expect("json"),
            serde_json::to_string(&*stacks[1]).expect("json")
        );
    }

    #[test]
    fn a_change_to_one_stack_leaves_the_others_alone() {
        let all = vec![frame("a"), frame("main"), frame("b"), frame("main")];
        let mut stacks: Vec<Frames> = Frames::share(all, vec![0..2, 2..4]).collect();
        stacks[1][0] = frame("c");
        assert_eq!(stacks[1][0].function, "c");
        assert_eq!(stacks[1].len(), 2);
        assert_eq!(stacks[0][0].function, "a");
        assert_eq!(stacks[0][1].function, "main");
    }
}
