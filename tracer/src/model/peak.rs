//! The heap at its peak, per process, in O(1) per event and without
//! copies (docs/peak.md).
//!
//! Each process keeps its in-use totals now, its highest totals so far and
//! a generation bumped at each new high. Each stack keeps what it held at
//! its process's latest peak only once it changes after that peak: the
//! first change after a new peak saves the stack's values from before the
//! change, and a stack not changed since the peak still holds at the peak
//! what it holds now. A new peak is one counter increment, whatever the
//! number of stacks.

/// The generation of a stack whose saved values are final: a folded
/// group's stack, the sum of what exited processes' stacks held at their
/// own peaks.
const FINAL: u64 = u64::MAX;

/// One process's in-use totals, now and at its peak (weighted estimates
/// when sampling). About 56 bytes per process, dropped with the process's
/// stacks (see `collect::peaks`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessPeak {
    bytes: f64,
    objects: f64,
    pub peak_bytes: f64,
    pub peak_objects: f64,
    /// Bumped at each new peak: a stack whose `StackPeak::generation` is
    /// not this one has not changed since the peak.
    generation: u64,
    /// When the peak was reached (the events' clock, CLOCK_MONOTONIC ns);
    /// None before any allocation, and for a folded group.
    pub at_ns: Option<u64>,
}

impl ProcessPeak {
    /// The process's in-use changed by (`bytes`, `objects`) at `at_ns`.
    /// True when that made a new peak.
    #[inline]
    pub fn changed(&mut self, bytes: f64, objects: f64, at_ns: u64) -> bool {
        self.bytes += bytes;
        self.objects += objects;
        if bytes <= 0.0 || self.bytes <= self.peak_bytes {
            return false;
        }
        self.peak_bytes = self.bytes;
        self.peak_objects = self.objects;
        self.generation += 1;
        self.at_ns = Some(at_ns);
        true
    }

    /// `other`'s peak added to this one (a folded group: the sum of its
    /// processes' peaks, which were not simultaneous).
    pub fn add_folded(&mut self, other: &ProcessPeak) {
        self.peak_bytes += other.peak_bytes;
        self.peak_objects += other.peak_objects;
        self.at_ns = None;
    }

    /// The peak, rounded like `Counts` (None before any allocation).
    pub fn rounded(&self) -> Option<(u64, u64)> {
        (self.generation > 0 || self.peak_bytes > 0.0)
            .then(|| (round(self.peak_bytes), round(self.peak_objects)))
    }
}

/// What one stack held at its process's latest peak, when it changed since
/// then: 24 bytes per stack.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StackPeak {
    bytes: f64,
    objects: f64,
    /// The process's generation when these were saved.
    generation: u64,
}

impl StackPeak {
    /// The stack's in-use is about to change from (`bytes`, `objects`):
    /// the first change since `process`'s latest peak saves them.
    #[inline]
    pub fn before_change(&mut self, process: &ProcessPeak, bytes: f64, objects: f64) {
        if self.generation != process.generation && self.generation != FINAL {
            self.bytes = bytes;
            self.objects = objects;
            self.generation = process.generation;
        }
    }

    /// What the stack held at `process`'s peak, given what it holds now.
    /// Without the process (never seen): what it holds now.
    pub fn at_peak(&self, process: Option<&ProcessPeak>, bytes: f64, objects: f64) -> (f64, f64) {
        match process {
            _ if self.generation == FINAL => (self.bytes, self.objects),
            Some(p) if p.generation == self.generation => (self.bytes, self.objects),
            _ => (bytes, objects),
        }
    }

    /// A folded process's stack, at its own peak, added to this group
    /// stack's, which keeps the sum from now on.
    pub fn add_folded(&mut self, (bytes, objects): (f64, f64)) {
        if self.generation != FINAL {
            *self = StackPeak {
                bytes: 0.0,
                objects: 0.0,
                generation: FINAL,
            };
        }
        self.bytes += bytes;
        self.objects += objects;
    }
}

/// Rounded like `Counts`: floating-point noise clamped at zero.
pub fn round(v: f64) -> u64 {
    v.max(0.0).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process with stacks, driven as the heap model drives them.
    #[derive(Default)]
    struct World {
        process: ProcessPeak,
        stacks: Vec<(f64, StackPeak)>,
    }

    impl World {
        fn change(&mut self, stack: usize, bytes: f64, at_ns: u64) {
            if self.stacks.len() <= stack {
                self.stacks.resize(stack + 1, (0.0, StackPeak::default()));
            }
            let (now, peak) = &mut self.stacks[stack];
            peak.before_change(&self.process, *now, 0.0);
            *now += bytes;
            self.process.changed(bytes, 0.0, at_ns);
        }

        fn at_peak(&self) -> Vec<f64> {
            self.stacks
                .iter()
                .map(|(now, peak)| peak.at_peak(Some(&self.process), *now, 0.0).0)
                .collect()
        }
    }

    #[test]
    fn given_a_peak_then_each_stack_gives_what_it_held_then() {
        let mut w = World::default();
        w.change(0, 100.0, 1);
        w.change(1, 50.0, 2);
        w.change(2, 10.0, 3); // the peak: 160
        w.change(1, -50.0, 4);
        w.change(2, -5.0, 5);
        w.change(3, 20.0, 6); // a stack new after the peak
        assert_eq!(w.process.peak_bytes, 160.0);
        assert_eq!(w.process.at_ns, Some(3));
        assert_eq!(w.at_peak(), [100.0, 50.0, 10.0, 0.0]);
    }

    #[test]
    fn given_a_stack_changed_several_times_after_the_peak_then_it_keeps_its_first_value() {
        let mut w = World::default();
        w.change(0, 40.0, 1);
        w.change(1, 60.0, 2); // the peak: 100
        for (i, d) in [-10.0, 5.0, -30.0, 20.0, -45.0].into_iter().enumerate() {
            w.change(1, d, 10 + i as u64);
        }
        w.change(0, -40.0, 20);
        assert_eq!(w.process.peak_bytes, 100.0);
        assert_eq!(w.at_peak(), [40.0, 60.0]);
        // Back above it: a new peak, and every stack as it is now.
        w.change(0, 50.0, 30);
        w.change(1, 50.0, 31); // 50 + 50 = 100: not above
        w.change(1, 1.0, 32); // 101: the new peak
        assert_eq!(w.process.at_ns, Some(32));
        assert_eq!(w.at_peak(), [50.0, 51.0]);
        w.change(0, -50.0, 33);
        w.change(0, 10.0, 34);
        w.change(0, -10.0, 35);
        assert_eq!(w.at_peak(), [50.0, 51.0]);
    }

    #[test]
    fn a_peak_is_strictly_higher_and_frees_never_make_one() {
        let mut w = World::default();
        w.change(0, 10.0, 1);
        w.change(0, -10.0, 2);
        w.change(0, 10.0, 3); // equal: the first moment stays the peak
        assert_eq!(w.process.at_ns, Some(1));
        assert_eq!(w.at_peak(), [10.0]);
        assert_eq!(ProcessPeak::default().rounded(), None);
        assert_eq!(w.process.rounded(), Some((10, 0)));
    }

    #[test]
    fn folded_stacks_keep_the_sum_of_their_peaks() {
        let mut a = World::default();
        a.change(0, 10.0, 1);
        a.change(0, -10.0, 2);
        let mut b = World::default();
        b.change(0, 7.0, 1);
        let mut group = StackPeak::default();
        let mut group_process = ProcessPeak::default();
        for w in [&a, &b] {
            let (now, peak) = &w.stacks[0];
            group.add_folded(peak.at_peak(Some(&w.process), *now, 0.0));
            group_process.add_folded(&w.process);
        }
        assert_eq!(group.at_peak(None, 0.0, 0.0), (17.0, 0.0));
        // Later changes (none should come) do not touch a final sum.
        group.before_change(&group_process, 0.0, 0.0);
        assert_eq!(group.at_peak(Some(&group_process), 3.0, 0.0), (17.0, 0.0));
        assert_eq!(group_process.rounded(), Some((17, 0)));
        assert_eq!(group_process.at_ns, None);
    }
}
