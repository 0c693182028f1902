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
    Hook, Note, Profile, Sort, StackReport,
};

/// Width of the labels in the header, so values line up.
const LABEL_WIDTH: usize = 12;

/// Writes the report, listing at most `top` stacks.
pub fn write_text(p: &Profile, top: usize, w: &mut impl Write) -> io::Result<()> {
    write_text_by(p, top, Sort::Inuse, w)
}

/// Writes the report, listing at most `top` stacks in the profile's order,
/// which `sort` describes (see `Profile::sort_stacks`).
pub fn write_text_by(p: &Profile, top: usize, sort: Sort, w: &mut impl Write) -> io::Result<()> {
    write_header(p, w)?;
    writeln!(w)?;
    write_totals(p, w)?;
    writeln!(w)?;
    super::groups_text::write_groups(p, w)?;
    write_stacks(p, top, sort, w)?;
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

fn write_stacks(p: &Profile, top: usize, sort: Sort, w: &mut impl Write) -> io::Result<()> {
    if p.stacks.is_empty() {
        return writeln!(w, "No allocations recorded.");
    }
    // `p.stacks` is sorted already, as `sort` says.
    let inuse: Vec<&StackReport> = p
        .stacks
        .iter()
        .filter(|s| s.counts.inuse_bytes > 0)
        .collect();
    let listed = if inuse.is_empty() {
        let what = match p.min_age_secs {
            Some(_) => "has been in use for the min age",
            None => "is still in use",
        };
        writeln!(
            w,
            "Nothing allocated during the trace {what}; top stacks by allocated bytes:"
        )?;
        by_alloc_bytes(&p.stacks)
    } else {
        writeln!(w, "Top stacks by {}:", sort.title())?;
        inuse
    };
    let shown: Vec<&StackReport> = listed.iter().take(top).copied().collect();
    let addresses = super::distinct::addresses_to_show(&shown, |f| frame_line(f, false));
    for (i, (stack, addresses)) in shown.iter().zip(&addresses).enumerate() {
        writeln!(w)?;
        write_stack(p, i + 1, stack, addresses, w)?;
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

fn by_alloc_bytes(stacks: &[StackReport]) -> Vec<&StackReport> {
    let mut sorted: Vec<&StackReport> = stacks.iter().collect();
    // Stable: ties keep the profile's order, so the output is deterministic.
    sorted.sort_by(|a, b| {
        (b.counts.alloc_bytes, b.counts.alloc_objects)
            .cmp(&(a.counts.alloc_bytes, a.counts.alloc_objects))
    });
    sorted
}

/// `addresses`: the frames (by index) whose address tells this stack from
/// another that prints alike.
fn write_stack(
    p: &Profile,
    rank: usize,
    stack: &StackReport,
    addresses: &[bool],
    w: &mut impl Write,
) -> io::Result<()> {
    let c = &stack.counts;
    writeln!(
        w,
        "#{rank}  {} in {} (allocated: {} in {}) {}",
        plural(c.inuse_bytes, "byte"),
        plural(c.inuse_objects, "object"),
        plural(c.alloc_bytes, "byte"),
        plural(c.alloc_objects, "object"),
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
