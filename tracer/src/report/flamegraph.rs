//! Flamegraph SVG, drawn by inferno from the collapsed form (as
//! `inferno-flamegraph` would from a `.folded` file).

use std::io::Write;

use anyhow::Context;
use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self, Options};

use super::collapsed::folded_lines;
use super::{Profile, View};

/// Writes an interactive flamegraph of `view`. An empty profile gives a small
/// SVG that says so, because inferno refuses empty input.
pub fn write_flamegraph(p: &Profile, view: View, w: &mut impl Write) -> anyhow::Result<()> {
    write_flamegraph_of(p, view, view.describe(), view.unit(), w)
}

/// Like `write_flamegraph`, with the numbers of `view` named `describe`
/// in the title and counted in `unit` (the live page draws growth rates
/// this way, put in the in-use field of a profile of its own).
pub fn write_flamegraph_of(
    p: &Profile,
    view: View,
    describe: &str,
    unit: &str,
    w: &mut impl Write,
) -> anyhow::Result<()> {
    let lines = folded_lines(p, view);
    // inferno escapes XML; control characters (not allowed in XML 1.0) and
    // the rest are escaped like every target-controlled name.
    let title = format!(
        "memtrace-bpf: {describe} — {}",
        crate::escape::text(&p.target)
    );
    if lines.is_empty() {
        return write_empty_svg(&title, describe, w).context("writing the flamegraph");
    }
    let mut opts = Options::default();
    opts.title = title;
    opts.subtitle = Some(subtitle(p));
    opts.count_name = unit.to_string();
    // flamegraph.pl's palette for memory profiles.
    opts.colors = Palette::Basic(BasicPalette::Mem);
    // Colors from a hash of the name, not random: the same profile gives
    // the same SVG, and a function keeps its color across reports.
    opts.deterministic = true;
    flamegraph::from_lines(&mut opts, lines.iter(), w)
        .context("rendering the flamegraph with inferno")
}

/// Duration, sampling and losses: what a reader needs to trust the widths.
fn subtitle(p: &Profile) -> String {
    let lost = match p.losses.lost() {
        0 => "no events lost".to_string(),
        n => format!("{} lost", super::counted(n, "event", "events")),
    };
    format!(
        "{:.1} s, {}, {}, {lost}",
        p.duration_secs,
        p.end_reason,
        p.sampling_description()
    )
}

fn write_empty_svg(title: &str, describe: &str, w: &mut impl Write) -> std::io::Result<()> {
    let message = format!("no allocations recorded ({describe})");
    writeln!(w, r#"<?xml version="1.0" standalone="no"?>"#)?;
    writeln!(
        w,
        r#"<svg version="1.1" width="1200" height="80" viewBox="0 0 1200 80" xmlns="http://www.w3.org/2000/svg">"#
    )?;
    writeln!(
        w,
        r#"<text x="600" y="30" text-anchor="middle" font-family="monospace" font-size="17">{}</text>"#,
        xml_escape(title)
    )?;
    writeln!(
        w,
        r#"<text x="600" y="60" text-anchor="middle" font-family="monospace" font-size="12">{}</text>"#,
        xml_escape(&message)
    )?;
    writeln!(w, "</svg>")
}

/// Escapes text for an XML text node or attribute (the target name is
/// user input).
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}
