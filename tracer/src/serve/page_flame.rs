//! The live page's flamegraph: in-use bytes, or the growth of the stacks
//! classed growing, drawn by inferno and inlined without what only its
//! script made work.

use std::{collections::HashMap, io::Write, sync::Arc};

use super::page_parts::{by_inuse, has_growth, html, top_growing, Flame, Page, NO_HISTORY};
use crate::report::{self, Frame, Profile, StackReport, View};

/// Stacks drawn in the flamegraph (the largest): keeps the page to a few
/// hundred KiB whatever the profile holds; /flamegraph.svg draws them all.
const FLAME_STACKS: usize = 200;

pub(super) fn write_flame(p: &Profile, page: &Page, w: &mut impl Write) -> anyhow::Result<()> {
    let flame = page.flame;
    // A number the server parsed: nothing to escape.
    let aged = page
        .min_age
        .map_or(String::new(), |secs| format!("&amp;min_age={secs}"));
    let link = |label: &str, to: Flame, href: &str| {
        if to == flame {
            format!("<strong>{label}</strong>")
        } else {
            format!("<a href=\"{href}{aged}\">{label}</a>")
        }
    };
    writeln!(
        w,
        "<h2>Flamegraph: {} | {} <small>(<a href=\"/flamegraph.svg\">interactive, all stacks</a>)</small></h2>",
        link("in-use bytes", Flame::Inuse, "/?flame=inuse"),
        link("growth", Flame::Growth, "/?flame=growth"),
    )?;
    let mut svg = Vec::new();
    let growing = classed_growing(p, usize::MAX);
    if flame == Flame::Growth && !growing.is_empty() {
        let (growth, note) = growth_profile(p, &growing);
        writeln!(w, "<p class=\"summary\">{}</p>", html(&note))?;
        report::write_flamegraph_of(
            &growth,
            View::InuseSpace,
            "growth (bytes/min)",
            "bytes/min",
            &mut svg,
        )?;
    } else {
        if flame == Flame::Growth {
            let why = match has_growth(p) {
                true => NONE_GROWING,
                false => NO_HISTORY,
            };
            writeln!(w, "<p class=\"none\">{why}; in-use bytes below</p>")?;
        }
        let (largest, note) = largest_profile(p);
        writeln!(w, "<p class=\"summary\">{}</p>", html(&note))?;
        report::write_flamegraph(&largest, View::InuseSpace, &mut svg)?;
    }
    let svg = String::from_utf8_lossy(&svg);
    writeln!(w, "<div class=\"flame\">{}</div>", inline_svg(&svg))?;
    Ok(())
}

/// A profile with `p`'s header and `stacks`, for the flamegraph.
fn with_stacks(p: &Profile, stacks: Vec<StackReport>) -> Profile {
    Profile {
        target: p.target.clone(),
        duration_secs: p.duration_secs,
        end_reason: p.end_reason.clone(),
        sample_rate: p.sample_rate,
        unwind: p.unwind.clone(),
        processes: p.processes.clone(),
        losses: p.losses,
        min_age_secs: p.min_age_secs,
        stacks,
        ..Profile::default()
    }
}

/// The stacks holding memory, weighted by their in-use bytes.
fn largest_profile(p: &Profile) -> (Profile, String) {
    let weighted: Vec<(&StackReport, u64)> = by_inuse(p)
        .into_iter()
        .map(|s| (s, s.counts.inuse_bytes))
        .collect();
    let note = flame_note(weighted.len(), "holding memory, weighted by in-use bytes");
    (with_stacks(p, flame_stacks(&weighted)), note)
}

/// Why the growth flamegraph is not drawn although there is history.
const NONE_GROWING: &str = "no stack is classed growing (yet): a stack needs a steady rise \
                            over 4 snapshots or more";

/// The stacks the table classes `growing`, each weighted by its growth in
/// bytes per minute: a plateau, churn or stable stack is not drawn even
/// when its slope is positive.
fn growth_profile(p: &Profile, growing: &[(&StackReport, f64)]) -> (Profile, String) {
    let weighted: Vec<(&StackReport, u64)> = growing
        .iter()
        // Saturating float-to-int cast; below 1 byte/min is 0.
        .map(|&(s, rate)| (s, (rate * 60.0).round() as u64))
        .collect();
    let note = flame_note(
        weighted.len(),
        "classed growing in the table below, weighted by bytes per minute",
    );
    (with_stacks(p, flame_stacks(&weighted)), note)
}

/// `n` stacks `what`, and how many the flamegraph sums as others.
fn flame_note(n: usize, what: &str) -> String {
    let stacks = report::counted(n as u64, "stack", "stacks");
    if n <= FLAME_STACKS {
        return format!("{stacks} {what}");
    }
    format!(
        "{stacks} {what}: the {FLAME_STACKS} largest drawn, the other {} summed as \
         {OTHER_STACKS} (every stack: /flamegraph.svg)",
        n - FLAME_STACKS
    )
}

/// The frame that stands for the stacks the page's flamegraph leaves out.
const OTHER_STACKS: &str = "[other stacks]";

/// The flamegraph's stacks from (stack, weight) pairs, largest first: the
/// first `FLAME_STACKS` with their weight as in-use bytes, the rest summed
/// into one `OTHER_STACKS` frame per process, so every width stays true.
fn flame_stacks(weighted: &[(&StackReport, u64)]) -> Vec<StackReport> {
    let (kept, rest) = weighted.split_at(weighted.len().min(FLAME_STACKS));
    let counts = |inuse_bytes| report::Counts {
        inuse_bytes,
        ..Default::default()
    };
    let mut out: Vec<StackReport> = kept
        .iter()
        .map(|(s, w)| StackReport {
            counts: counts(*w),
            ..(*s).clone()
        })
        .collect();
    let mut others: HashMap<(u32, Option<u64>, Option<String>), u64> = HashMap::new();
    for (s, w) in rest {
        let sum = others
            .entry((s.pid, s.start_time, s.exited_group.clone()))
            .or_default();
        *sum = sum.saturating_add(*w);
    }
    let other = Arc::new(Frame {
        function: OTHER_STACKS.to_string(),
        ..Frame::default()
    });
    out.extend(
        others
            .into_iter()
            .map(|((pid, start_time, exited_group), w)| StackReport {
                pid,
                start_time,
                exited_group,
                counts: counts(w),
                frames: vec![other.clone()].into(),
                ..StackReport::default()
            }),
    );
    out
}

/// Stacks the trend analysis classes growing, fastest first, at most `n`.
fn classed_growing(p: &Profile, n: usize) -> Vec<(&StackReport, f64)> {
    let mut growing = top_growing(p, usize::MAX);
    growing.retain(|(s, _)| s.trend == Some(report::Trend::Growing));
    growing.truncate(n);
    growing
}

/// inferno's SVG as an element of the page: without its XML prolog and
/// DOCTYPE, and without its script and `onload` handler, which the page's
/// CSP would block anyway (the page is static; /flamegraph.svg has them).
/// What only the script made work goes too (the Search box, Reset Zoom
/// and the hover lines), and the root row, which inferno leaves for the
/// script to fill, is labelled. inferno escapes every name, so the only
/// `<script` and `<text id=` are its own.
fn inline_svg(svg: &str) -> String {
    let svg = svg.find("<svg").map_or(svg, |i| &svg[i..]);
    let mut svg = svg.replacen(" onload=\"init(evt)\"", "", 1);
    cut(&mut svg, "<script", "</script>");
    for id in ["search", "matched", "unzoom", "details"] {
        cut(&mut svg, &format!("<text id=\"{id}\""), "</text>");
    }
    label_root(&mut svg);
    svg
}

/// Removes the first element from `start` to the `end` after it.
fn cut(svg: &mut String, start: &str, end: &str) {
    if let Some(from) = svg.find(start) {
        if let Some(len) = svg[from..].find(end) {
            svg.replace_range(from..from + len + end.len(), "");
        }
    }
}

/// inferno's root frame has an empty name, hence an empty row: it gets its
/// tooltip's text, `all (N bytes, 100%)` (numbers and the unit: nothing
/// the traced process chose).
fn label_root(svg: &mut String) {
    const ROOT: &str = "<g><title>all (";
    let Some(at) = svg.find(ROOT) else { return };
    let title = at + "<g><title>".len();
    let Some(title_len) = svg[title..].find("</title>") else {
        return;
    };
    let label = svg[title..title + title_len].to_string();
    let Some(end) = svg[at..].find("</g>").map(|i| at + i) else {
        return;
    };
    if let Some(empty) = svg[at..end].find("></text>").map(|i| at + i) {
        svg.insert_str(empty + 1, &label);
    }
}
