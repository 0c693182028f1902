//! The heap's history: at each tick (--interval, or --serve's own), the
//! totals and, per stack, the in-use bytes, read from the heap model's
//! per-stack sums (no symbolization). Then the growth analysis of a
//! series: least-squares slope and trend class. Pure: no BPF, no I/O.
//!
//! Bounded: past `MAX_POINTS` points the resolution halves (adjacent pairs
//! merged, keeping the later point's time and values, and later ticks are
//! recorded one in two), and at most `MAX_STACKS` stacks carry a series:
//! worst case 4,096 × 721 × 8 bytes ≈ 23.6 MB, plus the map's overhead.

use std::collections::{HashMap, HashSet};

use crate::{
    model::heap::StackHandle,
    report::{Counts, Trend},
};

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
}

#[derive(Debug)]
pub struct History {
    points: Vec<Point>,
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

/// Least-squares slope of `values` over `secs`, in bytes per second; None
/// with fewer than 2 points or no time between them.
pub fn slope(secs: &[f64], values: &[u64]) -> Option<f64> {
    fit(secs, values).map(|f| f.slope)
}

struct Fit {
    slope: f64,
    /// Coefficient of determination: the share of the variance the line
    /// explains (1 for a constant series).
    r2: f64,
}

fn fit(secs: &[f64], values: &[u64]) -> Option<Fit> {
    let n = secs.len().min(values.len());
    if n < 2 {
        return None;
    }
    let (secs, values) = (&secs[..n], &values[..n]);
    let mt = secs.iter().sum::<f64>() / n as f64;
    let my = values.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let (mut stt, mut sty, mut syy) = (0.0, 0.0, 0.0);
    for (&t, &y) in secs.iter().zip(values) {
        let (dt, dy) = (t - mt, y as f64 - my);
        stt += dt * dt;
        sty += dt * dy;
        syy += dy * dy;
    }
    if stt <= 0.0 {
        return None;
    }
    let slope = sty / stt;
    let r2 = match syy > 0.0 {
        true => (sty * sty) / (stt * syy),
        false => 1.0,
    };
    Some(Fit { slope, r2 })
}

/// Points needed to classify a series.
pub const MIN_TREND_POINTS: usize = 4;
/// Growing and plateau: the rise is at least this share of the series'
/// range (max - min), and above the noise floor (`NOISE_BLOCKS`).
const RISE_SHARE: f64 = 0.5;
/// Growing: the line explains at least this share of the variance.
const MIN_R2: f64 = 0.5;
/// Growing: the second half still rises at least this share of the whole
/// trace's rate (a third, not a half: at the default sample rate a 12 s,
/// 200 KB/s leak fell below half 3 times in 1000 simulated runs, never
/// below a third); plateau: the second half rises less than `FLAT_SHARE`
/// of the range.
const LATE_SHARE: f64 = 1.0 / 3.0;
const FLAT_SHARE: f64 = 0.2;
/// Churn: allocated at least this many times the peak in-use.
const CHURN_FACTOR: f64 = 10.0;
/// A rise of fewer than this many blocks is noise: a block of the stack's
/// mean size, or when sampling a sample rate of bytes if more (one
/// recorded block stands for about that much). In exact mode, a churning
/// stack caught between malloc and free at a tick holds one block then.
const NOISE_BLOCKS: f64 = 4.0;

/// The trend of a series (see README, "Growth and trends"): `counts` are
/// the stack's, `sample_rate` 1 in exact mode.
pub fn classify(secs: &[f64], values: &[u64], counts: &Counts, sample_rate: u64) -> Option<Trend> {
    let n = secs.len().min(values.len());
    if n < MIN_TREND_POINTS {
        return None;
    }
    let (secs, values) = (&secs[..n], &values[..n]);
    let whole = fit(secs, values)?;
    let peak = values.iter().copied().max().unwrap_or(0);
    let range = (peak - values.iter().copied().min().unwrap_or(0)) as f64;
    let block = match counts.alloc_objects {
        0 => 0.0,
        n => counts.alloc_bytes as f64 / n as f64,
    };
    let sampled = match sample_rate {
        0 | 1 => 0.0,
        r => r as f64,
    };
    let floor = NOISE_BLOCKS * block.max(sampled);
    let alloc_bytes = counts.alloc_bytes;
    let span = secs[n - 1] - secs[0];
    let rise = whole.slope * span;
    let half = n / 2;
    let late = fit(&secs[half..], &values[half..]);
    let late_slope = late.as_ref().map_or(0.0, |f| f.slope);
    if rise > floor
        && rise >= RISE_SHARE * range
        && whole.r2 >= MIN_R2
        && late_slope >= LATE_SHARE * whole.slope
    {
        return Some(Trend::Growing);
    }
    // Rose: the last quarter's level stands above the first half's low.
    let last_quarter = &values[n - n.div_ceil(4)..];
    let level = last_quarter.iter().map(|&v| v as f64).sum::<f64>() / last_quarter.len() as f64;
    let low = values[..half.max(1)].iter().copied().min().unwrap_or(0) as f64;
    let rose = level - low;
    let late_rise = late_slope * (secs[n - 1] - secs[half]);
    if rose > floor && rose >= RISE_SHARE * range && late_rise < FLAT_SHARE * range {
        return Some(Trend::Plateau);
    }
    if alloc_bytes as f64 >= CHURN_FACTOR * peak as f64 && alloc_bytes > 0 {
        return Some(Trend::Churn);
    }
    Some(Trend::Stable)
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

    #[test]
    fn slope_is_the_least_squares_rate() {
        let secs = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(slope(&secs, &[100, 300, 500, 700]), Some(200.0));
        assert_eq!(slope(&secs[..1], &[1]), None);
        assert_eq!(slope(&[2.0, 2.0], &[1, 5]), None);
    }

    fn secs(n: usize) -> Vec<f64> {
        (1..=n).map(|i| i as f64 * 0.5).collect()
    }

    fn alloc(bytes: u64, objects: u64) -> Counts {
        Counts {
            alloc_bytes: bytes,
            alloc_objects: objects,
            ..Counts::default()
        }
    }

    #[test]
    fn each_shape_gets_its_class_exact_and_sampled() {
        let t = secs(24);
        let leak: Vec<u64> = (1..=24).map(|i| i * 100_000).collect();
        let cache: Vec<u64> = (1..=24u64).map(|i| i.min(6) * 700_000).collect();
        let churn: Vec<u64> = (1..=24)
            .map(|i| if i % 7 == 0 { 1024 } else { 0 })
            .collect();
        let flat = vec![5_000u64; 24];
        for rate in [1, 65536] {
            assert_eq!(
                classify(&t, &leak, &alloc(2_400_000, 1200), rate),
                Some(Trend::Growing)
            );
            assert_eq!(
                classify(&t, &cache, &alloc(4_200_000, 1025), rate),
                Some(Trend::Plateau)
            );
            assert_eq!(
                classify(&t, &churn, &alloc(20_000_000, 20_000), rate),
                Some(Trend::Churn)
            );
            assert_eq!(
                classify(&t, &flat, &alloc(5_000, 5), rate),
                Some(Trend::Stable)
            );
        }
        // A sampled leak whose second half drew fewer samples (its rate
        // there about 0.45 of the whole trace's) still grows.
        let samples = [
            2, 3, 5, 6, 8, 10, 11, 13, 14, 16, 18, 19, 20, 20, 21, 21, 21, 22, 22, 23, 23, 24, 24,
            25,
        ];
        let sampled: Vec<u64> = samples.iter().map(|n| n * 65536).collect();
        assert_eq!(
            classify(&t, &sampled, &alloc(25 << 16, 800), 65536),
            Some(Trend::Growing)
        );
        // Sampling noise: one 64 KiB sample live at the last point only is
        // not a rise.
        let mut blip = vec![0u64; 24];
        blip[23] = 65536;
        assert_eq!(
            classify(&t, &blip, &alloc(5 << 20, 5000), 65536),
            Some(Trend::Churn)
        );
        // Exact mode: a churning stack caught between malloc and free at
        // the last points holds one block then: not a rise (without the
        // floor, growing and plateau).
        let churned = alloc(10 << 20, 10 << 10);
        for from in [7, 5] {
            let caught: Vec<u64> = (0..10).map(|i| if i >= from { 1024 } else { 0 }).collect();
            assert_eq!(classify(&t[..10], &caught, &churned, 1), Some(Trend::Churn));
        }
        assert_eq!(classify(&t[..3], &leak[..3], &alloc(1, 1), 1), None);
    }
}
