//! `/`: the live page. One server-rendered HTML document that reloads
//! itself every few seconds (a meta refresh: no script at all): the
//! flamegraph (in-use bytes, or growth when the trace has history), total
//! in-use bytes over time, the top growing stacks with their sparklines,
//! and the endpoints.
//!
//! Everything the traced process controls (function names, paths, command
//! lines) is hostile: it is escaped for a terminal (`escape::text`, which
//! also shows bidirectional overrides) and then for HTML. The response's
//! Content-Security-Policy allows no script, no frame and no fetch (see
//! `CSP`), so even a name that slipped through could not run or call out.

use std::io::Write;

use super::{
    chart,
    page_flame::write_flame,
    page_parts::{by_inuse, has_growth, html, top_growing, NO_HISTORY},
};

pub use super::page_parts::{Flame, Page};
use crate::report::{self, allocator_frames, Frame, Profile, StackReport};

/// Seconds between reloads.
pub const REFRESH_SECS: u32 = 5;
/// Rows of the stack table.
const TOP_STACKS: usize = 20;
/// Frames named per stack in the table, and characters per name.
const TABLE_FRAMES: usize = 40;
const NAME_CHARS: usize = 200;

/// No script of any kind (inferno's inline script and handlers included:
/// the page strips them and this blocks them), nothing fetched, no frame,
/// no form. Inline styles are allowed: the page's own sheet and the one
/// inside inferno's SVG; with nothing fetchable, CSS can reach nothing.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                       base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Writes the page of `p`.
pub fn write_page(p: &Profile, page: &Page, w: &mut impl Write) -> anyhow::Result<()> {
    let title = html(&format!("memtrace-bpf: {}", page.target));
    write!(
        w,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH_SECS}\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n"
    )?;
    writeln!(w, "<p class=\"summary\">{}</p>", summary(p))?;
    write_history(p, w)?;
    write_flame(p, page, w)?;
    write_stacks(p, w)?;
    write_endpoints(page.endpoints, w)?;
    writeln!(w, "</body></html>")?;
    Ok(())
}

const STYLE: &str = "body{font-family:sans-serif;margin:1em 2em;color:#222}\
    h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}\
    .summary,.none{color:#555}.none{font-style:italic}\
    table{border-collapse:collapse}td,th{padding:2px 8px;text-align:left;vertical-align:top}\
    td.n{text-align:right;white-space:nowrap}tr:nth-child(even){background:#f4f4f4}\
    summary{cursor:pointer}code{font-size:.9em}.chart text{font-size:11px;fill:#555}\
    .flame{max-width:100%;overflow-x:auto}";

fn summary(p: &Profile) -> String {
    let t = &p.totals;
    let lost = match p.losses.lost() {
        0 => "no events lost".to_string(),
        n => report::counted(n, "event lost", "events lost"),
    };
    let in_use = match p.min_age_secs {
        Some(secs) => format!("in use (blocks live {secs} s or more)"),
        None => "in use".to_string(),
    };
    html(&format!(
        "{:.1} s traced · {in_use}: {} in {} · allocated: {} · {} · {lost} · {} · reloads every {REFRESH_SECS} s",
        p.duration_secs,
        chart::human_bytes(t.inuse_bytes),
        report::counted(t.inuse_objects, "object", "objects"),
        chart::human_bytes(t.alloc_bytes),
        report::counted(p.stacks.len() as u64, "stack", "stacks"),
        p.sampling_description(),
    ))
}

fn write_history(p: &Profile, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "<h2>In-use bytes over time</h2>")?;
    let peaks: Vec<_> = p.processes.iter().filter_map(|proc| proc.peak).collect();
    let peak = match peaks.as_slice() {
        [] => None,
        [one] => Some(chart::PeakMark {
            secs: one.secs,
            bytes: one.inuse_bytes,
        }),
        _ => Some(chart::PeakMark {
            secs: None,
            bytes: p.totals.peak_inuse_bytes,
        }),
    };
    match chart::total_chart(&p.snapshots, peak) {
        Some(svg) if p.snapshots.len() >= 2 => writeln!(w, "{svg}")?,
        _ => writeln!(w, "<p class=\"none\">{NO_HISTORY}</p>")?,
    }
    write_memory(p, w)
}

/// The kernel's count of the memory beside the heap, and how much of its
/// growth the heap explains (the text report's lines): the cgroup's and
/// the three largest processes'.
fn write_memory(p: &Profile, w: &mut impl Write) -> std::io::Result<()> {
    let sampled = !p.sampling().is_exact();
    let mut processes: Vec<_> = p
        .processes
        .iter()
        .filter_map(|proc| Some((proc, proc.memory.as_ref()?)))
        .collect();
    processes.sort_by_key(|(_, m)| std::cmp::Reverse(m.end.resident_bytes));
    let cgroup = p
        .cgroup_memory
        .iter()
        .map(|m| ("the cgroup".to_string(), m, None));
    let processes = processes.into_iter().take(3).map(|(proc, m)| {
        (
            p.process_label(proc.pid, proc.start_time),
            m,
            Some(proc.pid),
        )
    });
    for (label, m, pid) in cgroup.chain(processes) {
        let lines = report::memory_text::explanation(m, pid, sampled);
        if lines.is_empty() {
            continue;
        }
        writeln!(
            w,
            "<p class=\"memory\">Memory of {} (resident {}, the kernel's count):</p><ul class=\"memory\">",
            html(&label),
            chart::human_bytes(m.end.resident_bytes)
        )?;
        for line in lines {
            writeln!(w, "<li>{}</li>", html(&line))?;
        }
        writeln!(w, "</ul>")?;
    }
    Ok(())
}

/// The top growing stacks; without history, the largest.
fn write_stacks(p: &Profile, w: &mut impl Write) -> std::io::Result<()> {
    if has_growth(p) {
        write_growing(p, w)
    } else {
        write_largest(p, w)
    }
}

/// The rising stacks with their trend class; the growth flamegraph draws
/// the ones classed `growing`.
fn write_growing(p: &Profile, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "<h2>Top stacks by growth</h2>")?;
    let growing = top_growing(p, TOP_STACKS);
    if growing.is_empty() {
        return writeln!(w, "<p class=\"none\">no stack grows</p>");
    }
    writeln!(
        w,
        "<table><tr><th>growth</th><th>trend</th><th>in use</th><th>history</th>\
         <th>stack</th></tr>"
    )?;
    for (s, rate) in growing {
        let trend = s.trend.map_or("", report::Trend::name);
        writeln!(
            w,
            "<tr><td class=\"n\">{}</td><td>{trend}</td><td class=\"n\">{}</td><td>{}</td>\
             <td>{}</td></tr>",
            html(&chart::human_rate(rate)),
            chart::human_bytes(s.counts.inuse_bytes),
            chart::sparkline(&s.series),
            stack_cell(p, s)
        )?;
    }
    writeln!(w, "</table>")
}

fn write_largest(p: &Profile, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "<h2>Top stacks by in-use bytes</h2>")?;
    writeln!(w, "<p class=\"none\">{NO_HISTORY}</p>")?;
    let stacks = by_inuse(p);
    writeln!(
        w,
        "<table><tr><th>in use</th><th>objects</th><th>stack</th></tr>"
    )?;
    for s in stacks.into_iter().take(TOP_STACKS) {
        writeln!(
            w,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            chart::human_bytes(s.counts.inuse_bytes),
            s.counts.inuse_objects,
            stack_cell(p, s)
        )?;
    }
    writeln!(w, "</table>")
}

/// The leaf and its callers in one line, from the first frame outside
/// the allocator and the standard collections (the frames before it
/// counted after them), the whole stack on a click (`<details>`: no
/// script).
fn stack_cell(p: &Profile, s: &StackReport) -> String {
    let names: Vec<String> = s.frames.iter().map(|f| name(f)).collect();
    let folded = allocator_frames::leading_allocator_frames(&s.frames);
    let mut short = names
        .iter()
        .skip(folded)
        .take(4)
        .cloned()
        .collect::<Vec<_>>()
        .join(" ← ");
    if folded > 0 {
        short.push(' ');
        short.push_str(&allocator_frames::folded_note(folded));
    }
    let mut full = String::new();
    for (frame, name) in s.frames.iter().zip(&names).take(TABLE_FRAMES) {
        let place = match (&frame.file, frame.line) {
            (Some(file), Some(line)) => format!(" {}:{line}", report::basename(file)),
            _ => format!(" {}", report::basename(&frame.module)),
        };
        full.push_str(&format!("<br><code>{name}</code>{}", html(&place)));
    }
    if s.frames.len() > TABLE_FRAMES {
        full.push_str(&format!(
            "<br>… {} more frames",
            s.frames.len() - TABLE_FRAMES
        ));
    }
    let process = if p.is_multi_process() {
        format!("{}: ", html(&p.stack_label(s)))
    } else {
        String::new()
    };
    format!("<details><summary>{process}<code>{short}</code></summary>{full}</details>")
}

/// A frame's name for the page: escaped, and cut at `NAME_CHARS`.
fn name(f: &Frame) -> String {
    let full = f.display_name();
    let mut cut: String = full.chars().take(NAME_CHARS).collect();
    if cut.len() < full.len() {
        cut.push('…');
    }
    html(&cut)
}

fn write_endpoints(endpoints: &str, w: &mut impl Write) -> std::io::Result<()> {
    writeln!(w, "<h2>Endpoints</h2><table>")?;
    for line in endpoints.lines().filter(|l| !l.trim().is_empty()) {
        let (path, what) = line.split_once("  ").unwrap_or((line, ""));
        let link = path.split(['?', ' ']).next().unwrap_or(path);
        if link.is_empty() {
            // A query every endpoint takes: nothing to link to.
            writeln!(
                w,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                html(path),
                html(what.trim())
            )?;
            continue;
        }
        writeln!(
            w,
            "<tr><td><a href=\"{}\"><code>{}</code></a></td><td>{}</td></tr>",
            html(link),
            html(path),
            html(what.trim())
        )?;
    }
    writeln!(w, "</table>")
}

#[cfg(test)]
mod tests;
