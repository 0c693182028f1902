//! When --snapshot-on-peak writes a snapshot: the bytes in use across the
//! whole trace (every traced process together) rose past the total at the
//! previous snapshot by the fraction asked for and by at least
//! `MIN_GROWTH_BYTES`. Counting the whole trace rather than each process
//! keeps processes that start (each one's first allocation is its own new
//! high) from counting as spikes: under --follow-forks, --binary or a
//! system-wide trace, a snapshot is written only when they hold more
//! together. Pure; a few numbers, no allocation.

/// Least growth over the previous snapshot's total that counts as a new
/// high: below it, a snapshot would show nothing a reader could see.
pub const MIN_GROWTH_BYTES: f64 = (1u64 << 20) as f64;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakTrigger {
    /// 1 + the fraction asked for.
    factor: f64,
    /// Bytes in use in live blocks of every traced process (weighted).
    live_bytes: f64,
    /// `live_bytes` when the last snapshot was taken (0 before any).
    high: f64,
    /// `live_bytes` rose past the threshold since the last snapshot.
    grown: bool,
}

impl PeakTrigger {
    /// A trigger at `fraction` above the previous snapshot (0.1 = 10 %).
    pub fn new(fraction: f64) -> PeakTrigger {
        PeakTrigger {
            factor: 1.0 + fraction,
            live_bytes: 0.0,
            high: 0.0,
            grown: false,
        }
    }

    /// Bytes in use changed by `bytes` (negative when freed).
    #[inline]
    pub fn changed(&mut self, bytes: f64) {
        self.live_bytes += bytes;
        if bytes > 0.0
            && self.live_bytes > self.high * self.factor
            && self.live_bytes - self.high >= MIN_GROWTH_BYTES
        {
            self.grown = true;
        }
    }

    /// The total rose past the threshold since the last `taken`.
    pub fn grown(&self) -> bool {
        self.grown
    }

    /// A snapshot was written: the next threshold counts from now.
    pub fn taken(&mut self) {
        self.high = self.live_bytes.max(0.0);
        self.grown = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = MIN_GROWTH_BYTES;

    #[test]
    fn given_many_processes_starting_and_exiting_then_no_new_high() {
        let mut t = PeakTrigger::new(0.1);
        t.changed(2.0 * MIB);
        assert!(t.grown(), "the first megabytes are a new high");
        t.taken();
        // A thousand short processes, each a new high of its own.
        for _ in 0..1000 {
            t.changed(64.0 * 1024.0);
            t.changed(-64.0 * 1024.0);
        }
        assert!(!t.grown());
    }

    #[test]
    fn given_growth_past_the_fraction_but_under_the_minimum_then_no_new_high() {
        let mut t = PeakTrigger::new(0.1);
        t.changed(100_000.0);
        assert!(!t.grown(), "100 kB is no spike");
        t.changed(MIB);
        assert!(t.grown());
        t.taken();
        t.changed(0.1 * (MIB + 100_000.0));
        assert!(!t.grown(), "10 % of 1.1 MB is under the minimum");
    }

    #[test]
    fn given_a_spike_then_a_new_high_and_the_next_counts_from_the_snapshot() {
        let mut t = PeakTrigger::new(0.1);
        t.changed(10.0 * MIB);
        t.taken();
        t.changed(MIB);
        assert!(!t.grown(), "11 MiB is not above 10 MiB × 1.1");
        t.changed(96.0 * MIB);
        assert!(t.grown());
        t.taken();
        t.changed(-96.0 * MIB);
        t.changed(50.0 * MIB);
        assert!(!t.grown(), "a lower burst is not a new high");
    }
}
