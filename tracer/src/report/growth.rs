//! The growth analysis as reports show it: the stacks' order (--sort), a
//! rate per minute and a sparkline of a stack's series.

use std::cmp::Ordering;

use super::{Profile, StackReport, Trend};

/// How the text and JSON reports order their stacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Sort {
    /// Largest in-use bytes first.
    #[default]
    Inuse,
    /// Fastest growing first (least-squares slope of in-use bytes over the
    /// history); stacks without a series last, by in-use bytes.
    Growth,
}

impl Sort {
    /// What the text report's stacks are ranked by.
    pub fn title(self) -> &'static str {
        match self {
            Sort::Inuse => "in-use bytes",
            Sort::Growth => "growth (least-squares slope of in-use bytes over the history)",
        }
    }
}

impl Profile {
    /// Orders the stacks for `sort` (the profile is built in in-use order).
    pub fn sort_stacks(&mut self, sort: Sort) {
        if sort == Sort::Growth {
            // Stable: ties keep the in-use order.
            self.stacks.sort_by(by_growth);
        }
    }
}

fn by_growth(a: &StackReport, b: &StackReport) -> Ordering {
    let rate = |s: &StackReport| s.growth_bytes_per_sec.unwrap_or(f64::NEG_INFINITY);
    rate(b).total_cmp(&rate(a))
}

impl Trend {
    pub fn name(self) -> &'static str {
        match self {
            Trend::Growing => "growing",
            Trend::Plateau => "plateau",
            Trend::Churn => "churn",
            Trend::Stable => "stable",
            Trend::Replacing => "replacing",
        }
    }
}

/// The text header's `24 snapshots from 0.5 s to 12.0 s`; None without a
/// history.
pub(super) fn history_line(p: &Profile) -> Option<String> {
    let (first, last) = (p.snapshots.first()?, p.snapshots.last()?);
    Some(format!(
        "{} from {:.1} s to {:.1} s",
        super::counted(p.snapshots.len() as u64, "snapshot", "snapshots"),
        first.secs,
        last.secs
    ))
}

/// A text stack's `+11.7 MiB/min, growing  ▁▂▃▄▅▆▇█`; None without a
/// series.
pub(super) fn growth_line(stack: &StackReport) -> Option<String> {
    let rate = stack.growth_bytes_per_sec?;
    let trend = stack
        .trend
        .map_or("too few snapshots to classify", Trend::name);
    Some(format!(
        "{}, {trend}  {}",
        rate_per_min(rate),
        sparkline(&stack.series)
    ))
}

/// `+1.2 MiB/min`, `-300 B/min`: a rate in bytes per second, per minute.
pub fn rate_per_min(bytes_per_sec: f64) -> String {
    let per_min = bytes_per_sec * 60.0;
    let sign = if per_min < 0.0 { "-" } else { "+" };
    let (value, unit) = super::binary_unit(per_min.abs());
    match unit {
        "B" => format!("{sign}{value:.0} B/min"),
        _ => format!("{sign}{value:.1} {unit}/min"),
    }
}

/// Widest sparkline, in characters: longer series are averaged into this
/// many buckets.
pub const SPARK_WIDTH: usize = 48;

/// `▁▂▃▄▅▆▇█` from the series' lowest to highest value (all `▁` when flat).
pub fn sparkline(series: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let buckets = series.len().min(SPARK_WIDTH);
    let values: Vec<f64> = (0..buckets)
        .map(|i| {
            let part = &series[i * series.len() / buckets..(i + 1) * series.len() / buckets];
            part.iter().map(|&v| v as f64).sum::<f64>() / part.len().max(1) as f64
        })
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    values
        .iter()
        .map(|&v| match hi > lo {
            true => BARS[(((v - lo) / (hi - lo)) * 7.0).round() as usize],
            false => BARS[0],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{fixtures::one_process, tests::check_golden, SnapshotPoint};

    /// `one_process` with a history of 5 snapshots, sorted by growth: the
    /// 40000-byte stack rose fastest then levelled off, the 4096-byte and
    /// 256-byte ones grow, the 512-byte one shrinks, the 1 MiB one churned.
    fn with_history() -> Profile {
        let mut p = one_process();
        p.snapshots = (1..=5u64)
            .map(|i| SnapshotPoint {
                secs: 2.0 * i as f64,
                inuse_bytes: 8000 * i,
                inuse_objects: 2 * i,
                alloc_bytes: 200_000 * i,
                resident_bytes: None,
            })
            .collect();
        let histories: [(&[u64], f64, Trend); 5] = [
            (
                &[20_000, 40_000, 40_000, 40_000, 40_000],
                2_000.0,
                Trend::Plateau,
            ),
            (&[0, 1024, 2048, 3072, 4096], 512.0, Trend::Growing),
            (&[1024, 896, 768, 640, 512], -64.0, Trend::Stable),
            (&[0, 64, 128, 192, 256], 32.0, Trend::Growing),
            (&[0, 0, 0, 0, 0], 0.0, Trend::Churn),
        ];
        for (stack, (series, rate, trend)) in p.stacks.iter_mut().zip(histories) {
            stack.series = series.to_vec();
            stack.growth_bytes_per_sec = Some(rate);
            stack.trend = Some(trend);
        }
        p.sort_stacks(Sort::Growth);
        p
    }

    #[test]
    fn text_and_json_with_a_history_match_golden() {
        let p = with_history();
        let mut text = Vec::new();
        crate::report::write_text_by(
            &p,
            10,
            Sort::Growth,
            crate::report::View::InuseSpace,
            &mut text,
        )
        .expect("write_text");
        check_golden("one_process.growth.txt", &text);
        let mut json = Vec::new();
        crate::report::write_json(&p, &mut json).expect("write_json");
        check_golden("one_process.growth.json", &json);
    }

    #[test]
    fn growth_order_is_fastest_first_then_in_use() {
        let p = with_history();
        let first: Vec<u64> = p.stacks.iter().map(|s| s.counts.inuse_bytes).collect();
        assert_eq!(first, [40_000, 4096, 256, 0, 512]);
    }

    #[test]
    fn rates_are_per_minute_in_binary_units() {
        assert_eq!(rate_per_min(20_480.0), "+1.2 MiB/min");
        assert_eq!(rate_per_min(-5.0), "-300 B/min");
        assert_eq!(rate_per_min(0.0), "+0 B/min");
    }

    #[test]
    fn sparklines_span_low_to_high_and_long_series_are_bucketed() {
        assert_eq!(sparkline(&[0, 1, 2, 3, 4, 5, 6, 7]), "▁▂▃▄▅▆▇█");
        assert_eq!(sparkline(&[5, 5, 5]), "▁▁▁");
        assert_eq!(sparkline(&[]), "");
        let long: Vec<u64> = (0..1000).collect();
        let line = sparkline(&long);
        assert_eq!(line.chars().count(), SPARK_WIDTH);
        assert!(line.starts_with('▁') && line.ends_with('█'));
    }
}
