//! Text report in the manner of `jeprof --text` and bcc's memleak: what was
//! traced, totals, the top stacks with their frames, then every loss counter.
//!
//! Every string a traced process controls (command lines, paths, symbol and
//! file names, notes quoting them) goes through `escape::text`: the report
//! is read in terminals, and one line must stay one line.

use std::io::{self, Write};

use crate::escape::text as esc;

use super::{
    basename, counted,
    growth::{growth_line, history_line},
    text_parts::{amount, frame_line, plural, write_frames, FRAME_INDENT},
    Counts, Hook, Note, Profile, Sort, StackReport, View,
};

/// Width of the labels in the header, so values line up.
const LABEL_WIDTH: usize = 12;

/// Writes the report, listing at most `top` stacks by in-use bytes.
pub fn write_text(p: &Profile, top: usize, w: &mut impl Write) -> io::Result<()> {
    write_text_by(p, top, Sort::Inuse, View::InuseSpace, w)
}

/// Writes the report, listing at most `top` stacks. `sort` describes the
/// profile's order (see `Profile::sort_stacks`); with `Sort::Inuse` the
/// stacks are ranked by `view`'s number (see `write_stacks`).
pub fn write_text_by(
    p: &Profile,
    top: usize,
    sort: Sort,
    view: View,
    w: &mut impl Write,
) -> io::Result<()> {
    write_header(p, w)?;
    writeln!(w)?;
    write_totals(p, w)?;
    writeln!(w)?;
    super::groups_text::write_groups(p, w)?;
    write_stacks(p, top, sort, view, w)?;
    super::memory_text::write_memory(p, w)?;
    super::text_peak::write_peak(p, top, w)?;
    super::churn_text::write_temporary_stacks(p, w, |stack, mut w| {
        write_frames(&stack.frames, stack.truncated, &[], &mut w)
    })?;
    write_exit_stacks(p, top, w)?;
    write_notes(&p.notes, w)?;
    writeln!(w)?;
    super::write_losses(&p.losses, w)
}

fn write_header(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    writeln!(w, "memtrace-bpf report: {}", esc(&p.target))?;
    field(w, "processes:", &process_lines(p))?;
    field(w, "duration:", &[format!("{:.1} s", p.duration_secs)])?;
    field(w, "ended:", &[esc(&p.end_reason)])?;
    field(w, "sampling:", &[p.sampling_description()])?;
    if let Some(line) = p.min_age_description() {
        field(w, "min age:", &[line])?;
    }
    field(w, "unwinding:", &[esc(&p.unwind)])?;
    if let Some(history) = history_line(p) {
        field(w, "history:", &[history])?;
    }
    let (hooked, skipped) = hook_lines(&p.hooks);
    if hooked.is_empty() {
        field(w, "hooked:", &["none"])?;
    } else {
        field(w, "hooked:", &hooked)?;
    }
    if !skipped.is_empty() {
        field(w, "skipped:", &skipped)?;
    }
    Ok(())
}

/// `  label:      first value`, further values aligned under the first.
fn field<S: AsRef<str>>(w: &mut impl Write, label: &str, values: &[S]) -> io::Result<()> {
    for (i, value) in values.iter().enumerate() {
        let label = if i == 0 { label } else { "" };
        writeln!(w, "  {label:<LABEL_WIDTH$}{}", value.as_ref())?;
    }
    Ok(())
}

fn process_lines(p: &Profile) -> Vec<String> {
    if p.processes.is_empty() {
        return vec!["none recorded".to_string()];
    }
    let width = p
        .processes
        .iter()
        .map(|proc| proc.pid.to_string().len())
        .max()
        .unwrap_or(0);
    let mut lines: Vec<String> = p
        .processes
        .iter()
        .take(PROCESS_LINES)
        .map(|proc| {
            if proc.folded > 0 {
                return format!(
                    "{:>width$}  {} of {} (their stacks summed)",
                    "-",
                    counted(proc.folded, "exited process", "exited processes"),
                    esc(&proc.program)
                );
            }
            let command = match (proc.command.as_str(), proc.program.as_str()) {
                ("", "") => "(command unknown)".into(),
                ("", program) => format!("{} (arguments unknown)", esc(program)).into(),
                (command, _) => esc(command),
            };
            let exited = match super::churn_text::oom_suffix(proc) {
                Some(killed) => killed,
                None if proc.exited => " (exited)".to_string(),
                None => String::new(),
            };
            let allocators: Vec<String> = proc
                .allocators
                .iter()
                .map(|a| format!("{} in {}", esc(&a.kind), esc(basename(&a.path))))
                .collect();
            let allocators = match allocators.is_empty() {
                true => String::new(),
                false => format!("  [{}]", allocators.join(" + ")),
            };
            let identity = super::groups_text::identity_suffix(&proc.identity);
            format!(
                "{:>width$}  {command}{exited}{allocators}{identity}",
                proc.pid
            )
        })
        .collect();
    let more = &p.processes[lines.len()..];
    if !more.is_empty() {
        let exited = more.iter().filter(|proc| proc.exited).count() as u64;
        lines.push(format!(
            "... {} more {} ({exited} exited; --format json lists them all)",
            more.len(),
            if more.len() == 1 {
                "process"
            } else {
                "processes"
            },
        ));
    }
    lines
}

/// Processes listed in the header; a system-wide trace may see thousands.
const PROCESS_LINES: usize = 12;

/// Hooks grouped per object, `malloc calloc free (libc.so.6)`; skipped ones
/// grouped per object and reason. Groups keep the order of first appearance.
fn hook_lines(hooks: &[Hook]) -> (Vec<String>, Vec<String>) {
    let mut hooked: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    let mut skipped: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    for hook in hooks {
        let groups = if hook.status.starts_with("attached") {
            &mut hooked
        } else {
            &mut skipped
        };
        let key = (hook.module.as_str(), hook.status.as_str());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, functions)) => functions.push(&hook.function),
            None => groups.push((key, vec![&hook.function])),
        }
    }
    // "attached (uprobe session)" adds its detail after the object.
    let hooked = hooked
        .into_iter()
        .map(|((module, status), functions)| {
            let detail = status
                .strip_prefix("attached")
                .unwrap_or("")
                .trim()
                .trim_matches(['(', ')']);
            let sep = if detail.is_empty() { "" } else { ", " };
            format!(
                "{} ({}{sep}{})",
                esc(&functions.join(" ")),
                esc(basename(module)),
                esc(detail)
            )
        })
        .collect();
    let skipped = skipped
        .into_iter()
        .map(|((module, status), functions)| {
            format!(
                "{} ({}): {}",
                esc(&functions.join(" ")),
                esc(basename(module)),
                esc(status)
            )
        })
        .collect();
    (hooked, skipped)
}

fn write_totals(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    let totals = &p.totals;
    writeln!(w, "Totals (allocations made during the trace):")?;
    let inuse = amount(totals.inuse_bytes, totals.inuse_objects);
    let alloc = amount(totals.alloc_bytes, totals.alloc_objects);
    field(w, "in use:", &[inuse])?;
    field(w, "allocated:", &[alloc])?;
    let at_exit = &p.not_freed_at_exit;
    if at_exit.objects > 0 {
        let by = counted(at_exit.processes, "exited process", "exited processes");
        field(
            w,
            "at exit:",
            &[format!(
                "{} not freed by {by}",
                amount(at_exit.bytes, at_exit.objects)
            )],
        )?;
    }
    for (label, line) in super::churn_text::total_lines(p) {
        field(w, label, &[line])?;
    }
    Ok(())
}

/// Where the blocks that exited processes never freed came from.
fn write_exit_stacks(p: &Profile, top: usize, w: &mut impl Write) -> io::Result<()> {
    let at_exit = &p.not_freed_at_exit;
    if at_exit.stacks.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(
        w,
        "Not freed at exit, by {} that exited during the trace (not in use: no live process \
         holds it):",
        counted(at_exit.processes, "process", "processes")
    )?;
    for (i, stack) in at_exit.stacks.iter().take(top).enumerate() {
        writeln!(w)?;
        let program = match stack.program.as_str() {
            "" => "an unknown program".to_string(),
            program => esc(basename(program)).into_owned(),
        };
        writeln!(
            w,
            "#{}  {} in {} by {} of {program}",
            i + 1,
            plural(stack.bytes, "byte"),
            plural(stack.objects, "object"),
            counted(stack.processes, "process", "processes"),
        )?;
        write_frames(&stack.frames, stack.truncated, &[], w)?;
    }
    let hidden =
        (at_exit.stacks.len() - at_exit.stacks.len().min(top)) as u64 + at_exit.stacks_left_out;
    if hidden > 0 {
        writeln!(w)?;
        writeln!(w, "{} not shown (--top)", plural(hidden, "more stack"))?;
    }
    Ok(())
}

/// The main list of stacks. The in-use views list the stacks with something
/// in use (the allocated views every stack); with `Sort::Inuse` they are
/// ranked by the view's number, and each heading gives that number first.
/// The peak views list by in-use bytes: the peak section ranks by the peak.
fn write_stacks(
    p: &Profile,
    top: usize,
    sort: Sort,
    view: View,
    w: &mut impl Write,
) -> io::Result<()> {
    if p.stacks.is_empty() {
        return writeln!(w, "No allocations recorded.");
    }
    let view = match view {
        View::PeakSpace | View::PeakObjects => View::InuseSpace,
        view => view,
    };
    let all = matches!(view, View::AllocSpace | View::AllocObjects);
    // `p.stacks` is sorted already, as `sort` says: by growth, or by in-use
    // bytes, which the default view keeps.
    let ranked: Vec<&StackReport> = p
        .stacks
        .iter()
        .filter(|s| all || view.value(&s.counts) > 0)
        .collect();
    let ranked = match (sort, view) {
        (Sort::Inuse, View::InuseSpace) | (Sort::Growth, _) => ranked,
        (Sort::Inuse, view) => by_view(ranked, view),
    };
    let title = match sort {
        Sort::Inuse => view.describe(),
        Sort::Growth => sort.title(),
    };
    let listed = if ranked.is_empty() {
        let what = match p.min_age_secs {
            Some(_) => "has been in use for the min age",
            None => "is still in use",
        };
        writeln!(
            w,
            "Nothing allocated during the trace {what}; top stacks by allocated bytes:"
        )?;
        by_view(p.stacks.iter().collect(), View::AllocSpace)
    } else {
        writeln!(w, "Top stacks by {title}:")?;
        ranked
    };
    let shown: Vec<&StackReport> = listed.iter().take(top).copied().collect();
    let addresses = super::distinct::addresses_to_show(&shown, |f| frame_line(f, false));
    for (i, (stack, addresses)) in shown.iter().zip(&addresses).enumerate() {
        writeln!(w)?;
        write_stack(p, i + 1, stack, view, addresses, w)?;
    }
    let hidden = listed.len().saturating_sub(top);
    let freed = p.stacks.len() - listed.len();
    if hidden > 0 || freed > 0 {
        writeln!(w)?;
    }
    if hidden > 0 {
        let stacks = plural(hidden as u64, "more stack");
        writeln!(w, "{stacks} not shown (--top)")?;
    }
    if freed > 0 {
        let stacks = plural(freed as u64, "stack");
        writeln!(w, "{stacks} with nothing left in use not listed")?;
    }
    Ok(())
}

/// `stacks` largest first by `view`'s number, then by its companion (bytes
/// for objects, objects for bytes).
fn by_view(mut stacks: Vec<&StackReport>, view: View) -> Vec<&StackReport> {
    let key = |c: &Counts| match view {
        View::InuseObjects => (c.inuse_objects, c.inuse_bytes),
        View::AllocSpace => (c.alloc_bytes, c.alloc_objects),
        View::AllocObjects => (c.alloc_objects, c.alloc_bytes),
        View::InuseSpace | View::PeakSpace | View::PeakObjects => (c.inuse_bytes, c.inuse_objects),
    };
    // Stable: ties keep the profile's order, so the output is deterministic.
    stacks.sort_by_key(|s| std::cmp::Reverse(key(&s.counts)));
    stacks
}

/// A heading's counts, `view`'s pair first: `40000 bytes in 10 objects
/// (allocated: ...)`, `256 objects, 1048576 bytes allocated (in use: ...)`.
fn heading_counts(c: &Counts, view: View) -> String {
    // The objects views name the objects first.
    let by_objects = matches!(view, View::InuseObjects | View::AllocObjects);
    let pair = |bytes, objects| match by_objects {
        false => format!("{} in {}", plural(bytes, "byte"), plural(objects, "object")),
        true => format!("{}, {}", plural(objects, "object"), plural(bytes, "byte")),
    };
    let inuse = pair(c.inuse_bytes, c.inuse_objects);
    let alloc = pair(c.alloc_bytes, c.alloc_objects);
    match view {
        View::AllocSpace | View::AllocObjects => format!("{alloc} allocated (in use: {inuse})"),
        View::InuseSpace | View::InuseObjects | View::PeakSpace | View::PeakObjects => {
            format!("{inuse} (allocated: {alloc})")
        }
    }
}

/// `addresses`: the frames (by index) whose address tells this stack from
/// another that prints alike.
fn write_stack(
    p: &Profile,
    rank: usize,
    stack: &StackReport,
    view: View,
    addresses: &[bool],
    w: &mut impl Write,
) -> io::Result<()> {
    writeln!(
        w,
        "#{rank}  {} {}",
        heading_counts(&stack.counts, view),
        match &stack.exited_group {
            Some(_) => esc(&p.stack_label(stack)).into_owned(),
            None => format!(
                "pid {}{}",
                stack.pid,
                super::groups_text::stack_group(p, stack)
            ),
        }
    )?;
    if let Some(growth) = growth_line(stack) {
        writeln!(w, "{FRAME_INDENT}{growth}")?;
    }
    write_frames(&stack.frames, stack.truncated, addresses, w)
}

fn write_notes(notes: &[Note], w: &mut impl Write) -> io::Result<()> {
    if notes.is_empty() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(w, "Notes:")?;
    for note in notes {
        writeln!(w, "  - {}", esc(&note.to_string()))?;
    }
    Ok(())
}
