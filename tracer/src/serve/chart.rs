//! The live page's small SVG drawings: the total in-use bytes over the
//! trace, and a sparkline per stack. Numbers only: nothing here comes from
//! the traced process, so nothing needs escaping.

use std::fmt::Write as _;

use crate::report::SnapshotPoint;

const CHART_WIDTH: f64 = 720.0;
const CHART_HEIGHT: f64 = 160.0;
/// Room left of the plot for the byte labels, and below it for the times.
const LEFT: f64 = 80.0;
const BOTTOM: f64 = 20.0;

const SPARK_WIDTH: f64 = 120.0;
const SPARK_HEIGHT: f64 = 24.0;

/// The heap's peak, for the chart: its bytes, and when (None when it is
/// a sum of several processes' peaks, which have no one time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakMark {
    pub secs: Option<f64>,
    pub bytes: u64,
}

/// Total in-use bytes at each snapshot, against seconds since the start,
/// with the peak marked (a dashed line at its height, a dot at its time):
/// a spike between two snapshots shows. Beside it, in green, the resident
/// bytes the kernel counted of the traced process or cgroup where the
/// snapshots have them. None without history.
pub fn total_chart(points: &[SnapshotPoint], peak: Option<PeakMark>) -> Option<String> {
    let (first, last) = (points.first()?, points.last()?);
    let max = points
        .iter()
        .flat_map(|p| [Some(p.inuse_bytes), p.resident_bytes])
        .flatten()
        .chain(peak.map(|p| p.bytes))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let span = (last.secs - first.secs).max(f64::EPSILON);
    let (plot_w, plot_h) = (CHART_WIDTH - LEFT - 10.0, CHART_HEIGHT - BOTTOM - 10.0);
    let xy = |p: &SnapshotPoint| {
        let x = LEFT + (p.secs - first.secs) / span * plot_w;
        let y = 10.0 + plot_h * (1.0 - p.inuse_bytes as f64 / max);
        (x, y)
    };
    let mut svg = format!(
        r#"<svg class="chart" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" role="img" aria-label="total in-use bytes over time">"#
    );
    let base = 10.0 + plot_h;
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{base}" x2="{right}" y2="{base}" stroke="#999"/><line x1="{LEFT}" y1="10" x2="{LEFT}" y2="{base}" stroke="#999"/><text x="{lx}" y="16" text-anchor="end">{top}</text><text x="{lx}" y="{base}" text-anchor="end">0</text><text x="{LEFT}" y="{ty}">{t0}</text><text x="{right}" y="{ty}" text-anchor="end">{t1}</text>"##,
        right = LEFT + plot_w,
        lx = LEFT - 6.0,
        top = human_bytes(max as u64),
        ty = CHART_HEIGHT - 4.0,
        t0 = human_secs(first.secs),
        t1 = human_secs(last.secs),
    );
    if let Some(peak) = peak.filter(|p| p.bytes > 0) {
        let y = 10.0 + plot_h * (1.0 - peak.bytes as f64 / max);
        let what = match peak.secs {
            Some(secs) => format!("peak: {} at {}", human_bytes(peak.bytes), human_secs(secs)),
            None => format!("sum of the processes' peaks: {}", human_bytes(peak.bytes)),
        };
        let _ = write!(
            svg,
            r##"<line class="peak" x1="{LEFT}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#e67e22" stroke-dasharray="4 3"><title>{what}</title></line>"##,
            right = LEFT + plot_w,
        );
        if let Some(secs) = peak.secs.filter(|s| (first.secs..=last.secs).contains(s)) {
            let x = LEFT + (secs - first.secs) / span * plot_w;
            let _ = write!(
                svg,
                r##"<circle class="peak" cx="{x:.1}" cy="{y:.1}" r="4" fill="#e67e22"><title>{what}</title></circle>"##
            );
        }
    }
    let resident: Vec<(f64, f64)> = points
        .iter()
        .filter_map(|p| {
            let bytes = p.resident_bytes?;
            let (x, _) = xy(p);
            Some((x, 10.0 + plot_h * (1.0 - bytes as f64 / max)))
        })
        .collect();
    if let Some(&(x, y)) = resident.last() {
        let last = points
            .iter()
            .rev()
            .find_map(|p| p.resident_bytes)
            .unwrap_or(0);
        let _ = write!(
            svg,
            r##"<g class="resident">{}<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="#27ae60"><title>resident (the kernel's count): {}</title></circle><text x="{tx:.1}" y="{ty:.1}" text-anchor="end" fill="#27ae60">resident</text></g>"##,
            polyline(resident.iter().copied(), "#27ae60", 1.5),
            human_bytes(last),
            tx = x - 6.0,
            ty = (y - 6.0).max(20.0),
        );
    }
    svg.push_str(&polyline(points.iter().map(xy), "#c0392b", 2.0));
    for p in points.iter().rev().take(1) {
        let (x, y) = xy(p);
        let _ = write!(
            svg,
            r##"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="#c0392b"><title>{} at {}</title></circle>"##,
            human_bytes(p.inuse_bytes),
            human_secs(p.secs)
        );
    }
    svg.push_str("</svg>");
    Some(svg)
}

/// A stack's in-use bytes at each snapshot, scaled to its own largest.
pub fn sparkline(series: &[u64]) -> String {
    let max = series.iter().copied().max().unwrap_or(0).max(1) as f64;
    let step = SPARK_WIDTH / (series.len().max(2) - 1) as f64;
    let points = series.iter().enumerate().map(|(i, v)| {
        let y = 2.0 + (SPARK_HEIGHT - 4.0) * (1.0 - *v as f64 / max);
        (i as f64 * step, y)
    });
    let (lo, hi) = (
        series.iter().copied().min().unwrap_or(0),
        series.iter().copied().max().unwrap_or(0),
    );
    format!(
        r#"<svg class="spark" width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}"><title>{} to {}</title>{}</svg>"#,
        human_bytes(lo),
        human_bytes(hi),
        polyline(points, "#2c7fb8", 1.5)
    )
}

fn polyline(points: impl Iterator<Item = (f64, f64)>, color: &str, width: f64) -> String {
    let mut out = String::from(r#"<polyline fill="none" points=""#);
    for (x, y) in points {
        let _ = write!(out, "{x:.1},{y:.1} ");
    }
    let _ = write!(out, r#"" stroke="{color}" stroke-width="{width}"/>"#);
    out
}

pub use crate::report::human_bytes;

/// `+1.2 MiB/min` from bytes per second (`-` when it shrinks): as the
/// text report writes it.
pub use crate::report::rate_per_min as human_rate;

/// `45 s`, `12.5 min`, `3.0 h`.
pub fn human_secs(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 7200.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_rate(20480.0 / 60.0), "+20.0 KiB/min");
        assert_eq!(human_rate(-1.0), "-60 B/min");
        assert_eq!(human_secs(30.0), "30 s");
        assert_eq!(human_secs(600.0), "10.0 min");
    }

    #[test]
    fn a_chart_needs_history_and_scales_to_its_largest_point() {
        assert_eq!(total_chart(&[], None), None);
        let at = |secs, inuse_bytes| SnapshotPoint {
            secs,
            inuse_bytes,
            ..SnapshotPoint::default()
        };
        let svg = total_chart(&[at(5.0, 1024), at(10.0, 2048)], None).expect("a chart");
        assert!(svg.contains(">2.0 KiB<"), "{svg}");
        assert!(!svg.contains("resident"), "no readings, no line: {svg}");
        let read = |secs, inuse_bytes, resident| SnapshotPoint {
            resident_bytes: Some(resident),
            ..at(secs, inuse_bytes)
        };
        let svg =
            total_chart(&[read(5.0, 1024, 8192), read(10.0, 2048, 16384)], None).expect("a chart");
        assert!(
            svg.contains(">16.0 KiB<"),
            "scaled to the resident bytes: {svg}"
        );
        assert!(
            svg.contains(r#"class="resident""#)
                && svg.contains("resident (the kernel's count): 16.0 KiB"),
            "{svg}"
        );
        assert!(svg.contains(">5 s<") && svg.contains(">10 s<"), "{svg}");
        // The first point is at the left edge, half way up.
        assert!(svg.contains("points=\"80.0,75.0 710.0,10.0 \""), "{svg}");
        assert!(!svg.contains("peak"), "{svg}");
    }

    #[test]
    fn the_peak_between_two_snapshots_is_marked_and_scales_the_chart() {
        let at = |secs, inuse_bytes| SnapshotPoint {
            secs,
            inuse_bytes,
            ..SnapshotPoint::default()
        };
        let peak = PeakMark {
            secs: Some(7.5),
            bytes: 4096,
        };
        let svg = total_chart(&[at(5.0, 1024), at(10.0, 2048)], Some(peak)).expect("a chart");
        assert!(svg.contains(">4.0 KiB<"), "scaled to the peak: {svg}");
        // Half way along, at the top.
        assert!(
            svg.contains(r#"<circle class="peak" cx="395.0" cy="10.0""#),
            "{svg}"
        );
        assert!(svg.contains("<title>peak: 4.0 KiB at 8 s</title>"), "{svg}");
        let sum = PeakMark { secs: None, ..peak };
        let svg = total_chart(&[at(5.0, 1024), at(10.0, 2048)], Some(sum)).expect("a chart");
        assert!(
            svg.contains("sum of the processes&#39; peaks")
                || svg.contains("sum of the processes' peaks"),
            "{svg}"
        );
        assert!(
            !svg.contains("<circle class=\"peak\""),
            "no one time: {svg}"
        );
    }

    #[test]
    fn a_sparkline_draws_each_value() {
        let svg = sparkline(&[0, 50, 100]);
        assert!(
            svg.contains("points=\"0.0,22.0 60.0,12.0 120.0,2.0 \""),
            "{svg}"
        );
        assert!(svg.contains("<title>0 B to 100 B</title>"), "{svg}");
        // One point, or none: still a drawing, not a division by zero.
        assert!(sparkline(&[7]).contains("0.0,2.0"));
        assert!(sparkline(&[]).contains("<polyline"));
    }
}
