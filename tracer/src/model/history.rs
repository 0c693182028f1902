//! The heap's history: at each tick (--interval, or --serve's own), the
//! totals and, per stack, the in-use bytes, read from the heap model's
//! per-stack sums (no symbolization); `model::trend` analyses the series.
//! Pure: no BPF, no I/O.
//!
//! Bounded: past `MAX_POINTS` points the resolution halves (adjacent pairs
//! merged, keeping the later point's time and values, and later ticks are
//! recorded one in two), and at most `MAX_STACKS` stacks carry a series:
//! worst case 4,096 × 721 × 8 bytes ≈ 23.6 MB, plus the map's overhead.

use std::collections::{HashMap, HashSet};

use crate::{model::heap::StackHandle, profile::Counts};

/// Points kept before the resolution halves.
pub const MAX_POINTS: usize = 720;
/// Stacks that carry a series: those with the largest in-use bytes.
pub const MAX_STACKS: usize = 4096;

/// One recorded tick: when, and the totals of every stack then.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    /// Seconds since the trace started.
    pub secs: f64,
    pub inuse_bytes: u64,
    pub inuse_objects: u64,
    pub alloc_bytes: u64,
    /// Bytes handed back by frees of blocks the trace never saw
    /// allocated, since the trace started (where the allocator tells).
    pub unknown_free_bytes: u64,
    /// The resident bytes the kernel counted of the traced process or
    /// cgroup (its last reading; None for other scopes).
    pub resident_bytes: Option<u64>,
}

#[derive(Debug)]
pub struct History {
    points: Vec<Point>,
    /// `Point::unknown_free_bytes` for the next point.
    unknown_free_bytes: u64,
    /// `Point::resident_bytes` for the next point.
    resident_bytes: Option<u64>,
    /// In-use bytes per point (same length as `points`), per stack.
    series: HashMap<StackHandle, Vec<u64>>,
    /// Stacks in the heap without a series at the last recorded point (the
    /// cap was reached): one admitted later did exist before, so its past
    /// is unknown (not 0).
    untracked: HashSet<StackHandle>,
    /// One tick in `stride` is recorded (doubles at each halving).
    stride: u32,
    ticks: u32,
    max_points: usize,
    max_stacks: usize,
}

impl Default for History {
    fn default() -> Self {
        History::with_limits(MAX_POINTS, MAX_STACKS)
    }
}

impl History {
    pub fn with_limits(max_points: usize, max_stacks: usize) -> History {
        History {
            points: Vec::new(),
            unknown_free_bytes: 0,
            resident_bytes: None,
            series: HashMap::new(),
            untracked: HashSet::new(),
            stride: 1,
            ticks: 0,
            max_points: max_points.max(2),
            max_stacks,
        }
    }

    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// Stack `h`'s in-use bytes at each point; None when it has no series.
    pub fn series(&self, h: StackHandle) -> Option<&[u64]> {
        self.series.get(&h).map(Vec::as_slice)
    }

    /// Stacks carrying a series.
    pub fn tracked(&self) -> usize {
        self.series.len()
    }

    /// The bytes frees of blocks the trace never saw allocated have handed
    /// back so far, for the next points.
    pub fn set_unknown_free_bytes(&mut self, bytes: u64) {
        self.unknown_free_bytes = bytes;
    }

    /// The kernel's resident bytes of what is traced, for the next points.
    pub fn set_resident_bytes(&mut self, bytes: Option<u64>) {
        self.resident_bytes = bytes;
    }

    /// A tick at `secs`, with the heap's per-stack totals now.
    pub fn tick(&mut self, secs: f64, stacks: impl Iterator<Item = (StackHandle, Counts)>) {
        self.ticks += 1;
        if self.ticks < self.stride {
            return;
        }
        self.ticks = 0;
        self.record(secs, stacks.collect());
    }

    fn record(&mut self, secs: f64, now: Vec<(StackHandle, Counts)>) {
        let mut point = Point {
            secs,
            unknown_free_bytes: self.unknown_free_bytes,
            resident_bytes: self.resident_bytes,
            ..Point::default()
        };
        for (_, c) in &now {
            point.inuse_bytes += c.inuse_bytes;
            point.inuse_objects += c.inuse_objects;
            point.alloc_bytes += c.alloc_bytes;
        }
        let before = self.points.len();
        let mut fresh: Vec<(StackHandle, u64, bool)> = Vec::new();
        for &(h, c) in &now {
            match self.series.get_mut(&h) {
                Some(s) => push_bounded(s, c.inuse_bytes, self.max_points + 1),
                None => fresh.push((h, c.inuse_bytes, self.untracked.contains(&h))),
            }
        }
        // Every handle with a series is in the heap (both drop a folded
        // one); should one not be, it holds nothing now.
        for s in self.series.values_mut().filter(|s| s.len() == before) {
            push_bounded(s, 0, self.max_points + 1);
        }
        self.admit(fresh, before);
        self.points.push(point);
        if self.points.len() > self.max_points {
            self.halve();
        }
    }

    /// Gives a series to the stacks without one, `(handle, in-use now,
    /// existed untracked)`, while there is room; past `max_stacks`, one
    /// holding more than the smallest tracked stack takes its place.
    fn admit(&mut self, mut fresh: Vec<(StackHandle, u64, bool)>, before: usize) {
        // Largest first: they take the free places, then displace the
        // tracked stacks holding less.
        fresh.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut smallest: Vec<(u64, StackHandle)> =
            match fresh.len() + self.series.len() > self.max_stacks {
                true => self
                    .series
                    .iter()
                    .map(|(&h, s)| (s.last().copied().unwrap_or(0), h))
                    .collect(),
                false => Vec::new(),
            };
        smallest.sort_unstable_by(|a, b| b.cmp(a)); // pop() gives the smallest
        let mut left_out = HashSet::new();
        for (h, inuse, existed) in fresh {
            if self.series.len() >= self.max_stacks {
                match smallest.last() {
                    Some(&(least, victim)) if least < inuse => {
                        smallest.pop();
                        self.series.remove(&victim);
                        left_out.insert(victim);
                    }
                    _ => {
                        left_out.insert(h);
                        continue;
                    }
                }
            }
            // A stack new since the last point held nothing before it; one
            // that existed untracked held an unknown amount: its first
            // value stands for its past (growth counts from here).
            let past = if existed { inuse } else { 0 };
            let mut s = Vec::with_capacity(before + 1);
            s.resize(before, past);
            s.push(inuse);
            self.series.insert(h, s);
        }
        self.untracked = left_out;
    }

    /// Adjacent pairs merged into their later point (an odd last point
    /// stays); from now on, one tick in twice as many is recorded.
    fn halve(&mut self) {
        fn keep<T: Copy>(v: &mut Vec<T>) {
            let n = v.len();
            let mut i = 0;
            v.retain(|_| {
                i += 1;
                i % 2 == 0 || i == n
            });
        }
        keep(&mut self.points);
        for s in self.series.values_mut() {
            keep(s);
        }
        self.stride = self.stride.saturating_mul(2);
    }

    /// Stack `from` was summed into `into` (folded) and its handle freed:
    /// its series is summed into `into`'s and goes.
    pub fn merge(&mut self, from: StackHandle, into: StackHandle) {
        self.untracked.remove(&from);
        let Some(from) = self.series.remove(&from) else {
            return;
        };
        match self.series.get_mut(&into) {
            Some(s) => s.iter_mut().zip(from).for_each(|(v, f)| *v += f),
            // `into` is the group's new stack (or had no series): it takes
            // `from`'s place.
            None => {
                self.untracked.remove(&into);
                self.series.insert(into, from);
            }
        }
    }
}

/// Pushes `v`, growing the capacity at most to `limit` (Vec's doubling
/// would reach 1024 values for 721): the worst case stays what `MAX_POINTS`
/// says.
fn push_bounded(s: &mut Vec<u64>, v: u64, limit: usize) {
    if s.len() == s.capacity() {
        let want = (s.capacity() * 2).clamp(4, limit.max(s.len() + 1));
        s.reserve_exact(want - s.len());
    }
    s.push(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(inuse_bytes: u64) -> Counts {
        Counts {
            inuse_bytes,
            inuse_objects: 1,
            alloc_bytes: inuse_bytes,
            alloc_objects: 1,
            ..Counts::default()
        }
    }

    #[test]
    fn past_the_point_limit_pairs_merge_into_their_later_point_and_ticks_thin_out() {
        let mut h = History::with_limits(8, 10);
        for i in 1..=9u64 {
            h.tick(i as f64, [(1, counts(i * 10))].into_iter());
        }
        // 9 points > 8: pairs (1,2) (3,4) (5,6) (7,8) keep 2 4 6 8; 9 stays.
        let secs: Vec<f64> = h.points().iter().map(|p| p.secs).collect();
        assert_eq!(secs, [2.0, 4.0, 6.0, 8.0, 9.0]);
        assert_eq!(h.series(1), Some(&[20, 40, 60, 80, 90][..]));
        assert_eq!(h.points()[4].inuse_bytes, 90);
        // Now one tick in two is recorded.
        for i in 10..=13u64 {
            h.tick(i as f64, [(1, counts(i * 10))].into_iter());
        }
        let secs: Vec<f64> = h.points().iter().map(|p| p.secs).collect();
        assert_eq!(secs, [2.0, 4.0, 6.0, 8.0, 9.0, 11.0, 13.0]);
        // A long run stays bounded.
        for i in 14..=100_000u64 {
            h.tick(i as f64, [(1, counts(i))].into_iter());
        }
        assert!(h.points().len() <= 9, "{}", h.points().len());
        assert_eq!(h.series(1).map(<[u64]>::len), Some(h.points().len()));
        let capacity = h.series.get(&1).map(Vec::capacity);
        assert!(capacity.is_some_and(|c| c <= 9), "{capacity:?}");
    }

    #[test]
    fn at_most_the_stack_limit_carry_a_series_the_largest_in_use() {
        let mut h = History::with_limits(100, 2);
        h.tick(
            1.0,
            [(1, counts(10)), (2, counts(20)), (3, counts(5))].into_iter(),
        );
        assert_eq!(h.tracked(), 2);
        assert_eq!(h.series(3), None);
        // Stack 3 grows past stack 1: it takes its place; its past is not
        // known (it existed untracked), so its first value stands for it.
        h.tick(
            2.0,
            [(1, counts(10)), (2, counts(20)), (3, counts(50))].into_iter(),
        );
        assert_eq!(h.series(1), None);
        assert_eq!(h.series(2), Some(&[20, 20][..]));
        assert_eq!(h.series(3), Some(&[50, 50][..]));
        // A stack new since the last point held nothing before it.
        let mut h = History::with_limits(100, 3);
        h.tick(1.0, [(1, counts(10))].into_iter());
        h.tick(2.0, [(1, counts(10)), (4, counts(7))].into_iter());
        assert_eq!(h.series(4), Some(&[0, 7][..]));
    }

    #[test]
    fn folded_stacks_sum_their_series_and_the_freed_handle_loses_its_own() {
        let mut h = History::with_limits(100, 10);
        h.tick(1.0, [(1, counts(10)), (2, counts(5))].into_iter());
        h.tick(2.0, [(1, counts(20)), (2, counts(5))].into_iter());
        h.merge(1, 7); // into a new group stack
        h.merge(2, 7);
        assert_eq!(h.series(7), Some(&[15, 25][..]));
        assert_eq!((h.series(1), h.series(2)), (None, None));
        // Handle 1 reused by a new stack: no past.
        h.tick(3.0, [(7, counts(25)), (1, counts(3))].into_iter());
        assert_eq!(h.series(1), Some(&[0, 0, 3][..]));
    }
}
