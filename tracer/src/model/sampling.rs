//! Byte-weighted sampling: the interval table the BPF side draws from, and
//! the weights that make the sampled numbers unbiased estimates.
//!
//! Sampling points fall on the stream of allocated bytes as a Poisson
//! process with mean interval R (jemalloc, Go, heapprofd). An allocation of
//! s bytes contains at least one point with probability 1 − e^(−s/R), so a
//! recorded one stands for s / (1 − e^(−s/R)) bytes and 1 / (1 − e^(−s/R))
//! objects.

use tracer_common::{EXP_TABLE_LEN, EXP_TABLE_SHIFT};

/// Entry i: the mean of −ln(u) over u in [i/N, (i+1)/N), in fixed point.
/// Conditional means keep the mean of the whole table at exactly 1, so the
/// mean interval is R even though the tail is cut at about 9.3 R.
pub fn exp_table() -> Vec<u32> {
    let n = EXP_TABLE_LEN as f64;
    // ∫ −ln(u) du = u − u ln u
    let antiderivative = |u: f64| if u == 0.0 { 0.0 } else { u - u * u.ln() };
    (0..EXP_TABLE_LEN)
        .map(|i| {
            let (a, b) = (i as f64 / n, (i + 1) as f64 / n);
            let mean = (antiderivative(b) - antiderivative(a)) * n;
            (mean * f64::from(1u32 << EXP_TABLE_SHIFT)).round() as u32
        })
        .collect()
}

/// How many allocations (objects) one recorded allocation of `size` bytes
/// stands for at mean sampling interval `rate`.
pub fn weight(size: u64, rate: u64) -> f64 {
    if rate <= 1 || size == 0 {
        return 1.0;
    }
    let p = -(-(size as f64) / rate as f64).exp_m1(); // 1 − e^(−s/R), precisely
    1.0 / p
}

/// A random interval drawn like the BPF side does, from `r` uniform bits.
pub fn draw_interval(table: &[u32], rate: u64, r: u32) -> u64 {
    let e = u64::from(table[r as usize % table.len()]);
    ((e * rate) >> EXP_TABLE_SHIFT).max(1)
}

/// Random bits from the kernel, for the initial per-CPU countdowns.
pub fn random_u32() -> u32 {
    let mut buf = [0u8; 4];
    // SAFETY: getrandom writes at most buf.len() bytes into buf.
    let _ = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    u32::from_ne_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_mean_one() {
        let t = exp_table();
        let mean: f64 = t.iter().map(|&v| f64::from(v)).sum::<f64>()
            / t.len() as f64
            / f64::from(1u32 << EXP_TABLE_SHIFT);
        assert!((mean - 1.0).abs() < 1e-4, "{mean}");
        assert!(t.windows(2).all(|w| w[0] >= w[1]), "decreasing");
    }

    #[test]
    fn weights() {
        assert_eq!(weight(100, 1), 1.0);
        assert_eq!(weight(0, 4096), 1.0);
        // Much larger than R: always sampled.
        assert!((weight(1 << 30, 4096) - 1.0).abs() < 1e-9);
        // Much smaller than R: weight ≈ R / s.
        assert!((weight(16, 1 << 20) - 65536.5).abs() < 1.0);
    }

    /// The whole scheme, simulated: the per-CPU countdown with intervals from
    /// the table, weighted estimates of two allocation patterns.
    #[test]
    fn simulated_sampling_gives_unbiased_estimates() {
        let table = exp_table();
        let rate = 65536;
        let mut state = 0x2545_f491_u32;
        let mut rand = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let mut left = draw_interval(&table, rate, rand()) as i64;
        let (mut small, mut large) = (0.0, 0.0);
        // Interleaved: 4 M blocks of 100 bytes and 4000 of 200000 bytes,
        // about 6000 and 12000 samples: a standard error near 1.3 %.
        for i in 0..4_004_000u64 {
            let size = if i % 1001 == 1000 { 200_000 } else { 100 };
            left -= size as i64;
            if left > 0 {
                continue;
            }
            left = draw_interval(&table, rate, rand()) as i64;
            let bytes = size as f64 * weight(size, rate);
            if size == 100 {
                small += bytes
            } else {
                large += bytes
            }
        }
        for (est, truth) in [(small, 400_000_000.0), (large, 800_000_000.0)] {
            assert!(
                (est / truth - 1.0).abs() < 0.05,
                "estimate {est} for {truth}"
            );
        }
    }
}
