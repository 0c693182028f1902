//! The text report's parts about OOM kills and temporary allocations
//! (docs/oom-and-temporary.md): a victim's line, the totals' lines, and
//! the stacks that churn most.

use std::io::{self, Write};

use crate::escape::text as esc;

use super::{counted, ProcessInfo, Profile, StackReport};

/// Stacks listed by temporary allocations.
const TEMPORARY_STACKS: usize = 5;

/// What follows a victim's command line in the process list.
pub(super) fn oom_suffix(proc: &ProcessInfo) -> Option<String> {
    let kill = proc.oom_killed?;
    Some(format!(
        " (killed by the OOM killer at {:.1} s, holding {} bytes in {})",
        kill.secs,
        kill.inuse_bytes,
        counted(kill.inuse_objects, "object", "objects"),
    ))
}

/// `(label, value)` lines for the totals: OOM kills and temporaries, when
/// there are any.
pub(super) fn total_lines(p: &Profile) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    if p.oom_kills > 0 {
        lines.push((
            "OOM kills:",
            format!(
                "{} (a victim's heap at the kill stays in use)",
                counted(p.oom_kills, "process", "processes")
            ),
        ));
    }
    if let Some(t) = p.temporary.filter(|t| t.objects > 0) {
        lines.push((
            "temporary:",
            format!(
                "{} ({} bytes) freed by their thread before its next allocation",
                counted(t.objects, "allocation", "allocations"),
                t.bytes
            ),
        ));
    }
    lines
}

/// "Top stacks by temporary allocations", when any stack has some.
pub(super) fn write_temporary_stacks(
    p: &Profile,
    w: &mut impl Write,
    mut frames: impl FnMut(&StackReport, &mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let mut churn: Vec<&StackReport> = p
        .stacks
        .iter()
        .filter(|s| s.temporary.is_some_and(|t| t.objects > 0))
        .collect();
    if churn.is_empty() {
        return Ok(());
    }
    // Stable: ties keep the profile's order.
    churn.sort_by_key(|s| std::cmp::Reverse(s.temporary.map(|t| t.objects)));
    writeln!(w)?;
    writeln!(
        w,
        "Top stacks by temporary allocations (freed by their thread before its next \
         allocation):"
    )?;
    for (i, stack) in churn.iter().take(TEMPORARY_STACKS).enumerate() {
        let t = stack.temporary.unwrap_or_default();
        writeln!(w)?;
        writeln!(
            w,
            "#{}  {} temporary ({} bytes) of {} allocated {}",
            i + 1,
            t.objects,
            t.bytes,
            stack.counts.alloc_objects,
            match &stack.exited_group {
                Some(_) => esc(&p.stack_label(stack)).into_owned(),
                None => format!("pid {}", stack.pid),
            }
        )?;
        frames(stack, w)?;
    }
    Ok(())
}
