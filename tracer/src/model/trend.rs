//! The growth analysis of a stack's history: least-squares slope of its
//! in-use bytes over the snapshots' times, and its trend class (see
//! docs/growth.md). Pure.

use crate::profile::{Counts, Sampling, Trend};

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
/// Growing below the noise floor: a series of at least
/// `STEADY_MIN_POINTS` that rises at `STEADY_SHARE` of its steps at least,
/// by more than a sample rate when sampling. A buffer that realloc grows
/// holds one block whose mean allocated size is about its size: it never
/// rises by 4 of them. A churning stack caught between malloc and free
/// rises at a step or two (its level is mostly the same few blocks), and
/// a sampled one's wanders up and down about as often.
const STEADY_SHARE: f64 = 2.0 / 3.0;
const STEADY_MIN_POINTS: usize = 6;

/// The trend of a series (see docs/growth.md): `counts` are
/// the stack's.
pub fn classify(
    secs: &[f64],
    values: &[u64],
    counts: &Counts,
    sampling: Sampling,
) -> Option<Trend> {
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
    let sampled = match sampling {
        Sampling::Exact => 0.0,
        Sampling::Bytes(r) => r as f64,
    };
    let floor = NOISE_BLOCKS * block.max(sampled);
    let alloc_bytes = counts.alloc_bytes;
    let span = secs[n - 1] - secs[0];
    let rise = whole.slope * span;
    let half = n / 2;
    let late = fit(&secs[half..], &values[half..]);
    let late_slope = late.as_ref().map_or(0.0, |f| f.slope);
    let rises = values.windows(2).filter(|w| w[1] > w[0]).count();
    let steady =
        n >= STEADY_MIN_POINTS && rises as f64 >= STEADY_SHARE * (n - 1) as f64 && rise > sampled;
    if (rise > floor || steady)
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

/// Whether a stack classed growing at `stack` bytes per second is a full
/// cache replacing entries it held before the trace: frees of blocks the
/// trace never saw allocated handed back at least half its rate
/// (`unknown`, bytes per second) and the heap as a whole (the traced
/// in-use bytes, `heap`, less those frees) rose by less than half its rate.
/// A leak beside such a cache keeps the heap rising at its own rate, so it
/// stays growing.
pub fn replacing(stack: f64, unknown: f64, heap: f64) -> bool {
    stack > 0.0 && unknown >= REPLACED_SHARE * stack && heap - unknown < REPLACED_SHARE * stack
}

/// See `replacing`.
const REPLACED_SHARE: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_cache_replacing_older_entries_is_told_from_a_leak_beside_it() {
        // full_cache.c: 204,800 B/s of replacements, 20,480 B/s leaked, the
        // replaced entries (2,056 usable bytes for 2,048 asked) from before.
        let unknown = 205_600.0;
        let heap = 204_800.0 + 20_480.0;
        assert!(replacing(204_800.0, unknown, heap));
        assert!(!replacing(20_480.0, unknown, heap));
        // Traced from the start (no older blocks) or sampled: unknown 0.
        assert!(!replacing(204_800.0, 0.0, heap));
        // Older blocks freed, but the heap grows as fast as the stack.
        assert!(!replacing(204_800.0, unknown, heap + 204_800.0));
        assert!(!replacing(0.0, unknown, heap));
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
                classify(
                    &t,
                    &leak,
                    &alloc(2_400_000, 1200),
                    Sampling::from_rate(rate)
                ),
                Some(Trend::Growing)
            );
            assert_eq!(
                classify(
                    &t,
                    &cache,
                    &alloc(4_200_000, 1025),
                    Sampling::from_rate(rate)
                ),
                Some(Trend::Plateau)
            );
            assert_eq!(
                classify(
                    &t,
                    &churn,
                    &alloc(20_000_000, 20_000),
                    Sampling::from_rate(rate)
                ),
                Some(Trend::Churn)
            );
            assert_eq!(
                classify(&t, &flat, &alloc(5_000, 5), Sampling::from_rate(rate)),
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
            classify(
                &t,
                &sampled,
                &alloc(25 << 16, 800),
                Sampling::from_rate(65536)
            ),
            Some(Trend::Growing)
        );
        // Sampling noise: one 64 KiB sample live at the last point only is
        // not a rise.
        let mut blip = vec![0u64; 24];
        blip[23] = 65536;
        assert_eq!(
            classify(&t, &blip, &alloc(5 << 20, 5000), Sampling::from_rate(65536)),
            Some(Trend::Churn)
        );
        // Exact mode: a churning stack caught between malloc and free at
        // the last points holds one block then: not a rise (without the
        // floor, growing and plateau).
        let churned = alloc(10 << 20, 10 << 10);
        for from in [7, 5] {
            let caught: Vec<u64> = (0..10).map(|i| if i >= from { 1024 } else { 0 }).collect();
            assert_eq!(
                classify(&t[..10], &caught, &churned, Sampling::from_rate(1)),
                Some(Trend::Churn)
            );
        }
        assert_eq!(
            classify(&t[..3], &leak[..3], &alloc(1, 1), Sampling::Exact),
            None
        );
    }

    /// A buffer that realloc grows by 10 KiB a tick, traced from when it
    /// held 100 KiB (the demo's log): one live block, its mean allocated
    /// size about its size, so the rise stays under 4 blocks; it rises at
    /// every step: growing, exact and sampled.
    #[test]
    fn a_buffer_realloc_grows_steadily_is_growing() {
        let t = secs(10);
        let sizes: Vec<u64> = (1..=10u64).map(|i| 100 * 1024 + i * 10_240).collect();
        // One realloc per step: allocated the sum of the sizes.
        let allocated = alloc(sizes.iter().sum::<u64>(), 10);
        assert_eq!(
            classify(&t, &sizes, &allocated, Sampling::from_rate(1)),
            Some(Trend::Growing)
        );
        assert_eq!(
            classify(&t, &sizes, &allocated, Sampling::from_rate(16384)),
            Some(Trend::Growing)
        );
        // When sampling, a rise under a sample rate is not growth.
        assert_ne!(
            classify(&t, &sizes, &allocated, Sampling::from_rate(1 << 20)),
            Some(Trend::Growing)
        );
        // Rising at one step in three only, under the floor: not growing.
        let stepped: Vec<u64> = (0..10u64).map(|i| 100 * 1024 + (i / 3) * 10_240).collect();
        assert_ne!(
            classify(&t, &stepped, &allocated, Sampling::from_rate(1)),
            Some(Trend::Growing)
        );
        // Too few points to call a steady rise.
        assert_ne!(
            classify(&t[..5], &sizes[..5], &allocated, Sampling::from_rate(1)),
            Some(Trend::Growing)
        );
    }
}
