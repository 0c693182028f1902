//! The text report's "Heap at its peak" section: when each process's
//! traced heap was highest and how much it held, the stacks that held the
//! most then, and what the peak held that the end does not (docs/peak.md).

use std::io::{self, Write};

use crate::escape::text as esc;

use super::{
    distinct::addresses_to_show,
    text_parts::{amount, frame_line, plural, write_frames},
    Profile, StackReport,
};

/// Processes given a line of their own; the rest are summed.
const PROCESS_LINES: usize = 12;

/// Writes the section; nothing when no stack has a peak (a file saved
/// before peaks were tracked, or nothing allocated).
pub(super) fn write_peak(p: &Profile, top: usize, w: &mut impl Write) -> io::Result<()> {
    if p.totals.peak_inuse_objects == 0 {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(
        w,
        "Heap at its peak (each process at its own highest moment):"
    )?;
    let mut peaks: Vec<_> = p
        .processes
        .iter()
        .filter_map(|proc| Some((proc, proc.peak?)))
        .filter(|(_, peak)| peak.inuse_objects > 0)
        .collect();
    peaks.sort_by_key(|(_, peak)| std::cmp::Reverse(peak.inuse_bytes));
    for (proc, peak) in peaks.iter().take(PROCESS_LINES) {
        let label = match proc.folded {
            0 => p.process_label(proc.pid, proc.start_time),
            n => format!(
                "{} ({})",
                super::basename(&proc.program),
                super::counted(n, "exited process", "exited processes")
            ),
        };
        let when = match peak.secs {
            Some(secs) => format!("at {secs:.2} s"),
            None => "the sum of their peaks".to_string(),
        };
        writeln!(
            w,
            "  {}: {} {when}",
            esc(&label),
            amount(peak.inuse_bytes, peak.inuse_objects)
        )?;
    }
    if peaks.len() > PROCESS_LINES {
        writeln!(
            w,
            "  ... {} more (--format json lists them all)",
            super::counted((peaks.len() - PROCESS_LINES) as u64, "process", "processes")
        )?;
    }
    let t = &p.totals;
    if peaks.len() > 1 {
        writeln!(
            w,
            "  sum of the processes' peaks: {} (not one moment: each peaked on its own)",
            amount(t.peak_inuse_bytes, t.peak_inuse_objects)
        )?;
    }
    let gone: (u64, u64) = p.stacks.iter().fold((0, 0), |(b, o), s| {
        let c = &s.counts;
        (
            b + c.peak_inuse_bytes.saturating_sub(c.inuse_bytes),
            o + c.peak_inuse_objects.saturating_sub(c.inuse_objects),
        )
    });
    writeln!(
        w,
        "  held at the peak, not at the end: {}",
        amount(gone.0, gone.1)
    )?;
    write_peak_stacks(p, top, w)
}

/// The stacks that held the most at the peak, largest first.
fn write_peak_stacks(p: &Profile, top: usize, w: &mut impl Write) -> io::Result<()> {
    let mut listed: Vec<&StackReport> = p
        .stacks
        .iter()
        .filter(|s| s.counts.peak_inuse_bytes > 0)
        .collect();
    // Stable: ties keep the profile's order.
    listed.sort_by_key(|s| std::cmp::Reverse(s.counts.peak_inuse_bytes));
    writeln!(w)?;
    writeln!(w, "Top stacks at the peak:")?;
    let shown: Vec<&StackReport> = listed.iter().take(top).copied().collect();
    let addresses = addresses_to_show(&shown, |f| frame_line(f, false));
    for (i, (stack, addresses)) in shown.iter().zip(&addresses).enumerate() {
        let c = &stack.counts;
        writeln!(w)?;
        writeln!(
            w,
            "#{}  {} in {} at the peak (at the end: {} in {}) {}",
            i + 1,
            plural(c.peak_inuse_bytes, "byte"),
            plural(c.peak_inuse_objects, "object"),
            plural(c.inuse_bytes, "byte"),
            plural(c.inuse_objects, "object"),
            match &stack.exited_group {
                Some(_) => esc(&p.stack_label(stack)).into_owned(),
                None => format!("pid {}", stack.pid),
            }
        )?;
        write_frames(&stack.frames, stack.truncated, addresses, w)?;
    }
    let hidden = listed.len().saturating_sub(top);
    if hidden > 0 {
        writeln!(w)?;
        writeln!(
            w,
            "{} not shown (--top)",
            plural(hidden as u64, "more stack")
        )?;
    }
    Ok(())
}
