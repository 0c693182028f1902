//! Collapsed ("folded") stacks: `root;...;leaf VALUE`, one line per unique
//! stack, the input format of inferno, flamegraph.pl and speedscope.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};
use std::ops::Range;
use std::sync::Arc;

use super::json::PtrMap;
use super::{Frame, Profile, StackReport, View, NO_STACK, TRUNCATED};
use crate::escape;

/// Writes one line per unique stack with a non-zero value for `view`,
/// sorted by stack so the output is deterministic and diffable.
pub fn write_collapsed(p: &Profile, view: View, w: &mut impl Write) -> io::Result<()> {
    let folded = Folded::new(p, view);
    for (stack, value) in folded.lines() {
        w.write_all(stack.as_bytes())?;
        writeln!(w, " {value}")?;
    }
    Ok(())
}

/// The collapsed lines without newlines, sorted; shared with the flamegraph,
/// which inferno draws from exactly this form.
pub(super) fn folded_lines(p: &Profile, view: View) -> FoldedLines {
    let folded = Folded::new(p, view);
    // One string for all the lines, as `Folded` (100 k lines were 100 k
    // strings).
    let mut text = String::with_capacity(folded.text.len() + folded.lines.len() * 8);
    let mut lines = Vec::with_capacity(folded.lines.len());
    for (stack, value) in folded.lines() {
        let start = text.len();
        // Writing to a String cannot fail.
        let _ = write!(text, "{stack} {value}");
        lines.push(start..text.len());
    }
    FoldedLines { text, lines }
}

/// `stack value` lines (see `folded_lines`).
pub(super) struct FoldedLines {
    text: String,
    lines: Vec<Range<usize>>,
}

impl FoldedLines {
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.lines.iter().map(|r| &self.text[r.clone()])
    }
}

/// Each distinct `root;...;leaf` with its summed value, sorted. The stacks
/// are written one after another into one string, not one string each:
/// 100 k stacks cost a few dozen allocations rather than 100 k (and while
/// the report is written, every allocation of the tracer traps through the
/// allocator probes, which stay attached until it is done).
struct Folded {
    text: String,
    /// (stack in `text`, value), sorted by stack, each stack once.
    lines: Vec<(Range<usize>, u64)>,
}

impl Folded {
    fn new(p: &Profile, view: View) -> Folded {
        let multi = p.is_multi_process();
        // Frames are shared Arcs: each is named and sanitized once, not once
        // per stack it appears in (100 k stacks of 40 frames hold a few
        // thousand distinct frames).
        let mut names = Names::default();
        let mut text = String::new();
        let mut lines = Vec::new();
        for stack in &p.stacks {
            let value = view.value(&stack.counts);
            if value == 0 {
                continue;
            }
            let start = text.len();
            push_stack(p, stack, multi, &mut names, &mut text);
            lines.push((start..text.len(), value));
        }
        lines.sort_unstable_by(|(a, _), (b, _)| text[a.clone()].cmp(&text[b.clone()]));
        // Stacks that differ only in offsets render identically: inferno
        // would draw them as one frame anyway, so merge them into one line.
        lines.dedup_by(|(next, value), (kept, sum)| {
            let same = text[next.clone()] == text[kept.clone()];
            if same {
                *sum = sum.saturating_add(*value);
            }
            same
        });
        Folded { text, lines }
    }

    fn lines(&self) -> impl Iterator<Item = (&str, u64)> {
        self.lines
            .iter()
            .map(|(range, value)| (&self.text[range.clone()], *value))
    }
}

/// Sanitized names of frames (by pointer) and of process root frames (by
/// pid, start time and folded group), each made once.
#[derive(Default)]
struct Names {
    frames: PtrMap<String>,
    processes: HashMap<(u32, Option<u64>, Option<String>), String>,
    /// --group-by cgroup|container: each process's group, as a root frame.
    groups: HashMap<(u32, Option<u64>, Option<String>), String>,
}

impl Names {
    fn frame(&mut self, frame: &Arc<Frame>) -> &str {
        // The pointer is valid and unique while the profile is borrowed,
        // which outlives this cache.
        self.frames
            .entry(Arc::as_ptr(frame))
            .or_insert_with(|| sanitize(&frame.display_name()))
    }

    fn process(&mut self, p: &Profile, stack: &StackReport) -> &str {
        self.processes
            .entry((stack.pid, stack.start_time, stack.exited_group.clone()))
            .or_insert_with(|| sanitize(&p.stack_label(stack)))
    }

    fn group(&mut self, p: &Profile, stack: &StackReport) -> Option<&str> {
        if p.group_by == super::GroupBy::Process {
            return None;
        }
        let name = self
            .groups
            .entry((stack.pid, stack.start_time, stack.exited_group.clone()))
            .or_insert_with(|| {
                p.group_of(stack)
                    .map(|g| sanitize(&g.group))
                    .unwrap_or_default()
            });
        Some(name)
    }
}

/// Appends `root;...;leaf` to `out`, with a process root frame when
/// several processes share the profile, under the process's group's frame
/// with --group-by cgroup or container.
fn push_stack(p: &Profile, stack: &StackReport, multi: bool, names: &mut Names, out: &mut String) {
    let mut first = true;
    let mut push = |name: &str| {
        if !first {
            out.push(';');
        }
        first = false;
        out.push_str(name);
    };
    if let Some(group) = names.group(p, stack) {
        push(group);
    }
    if multi {
        push(names.process(p, stack));
    }
    if stack.truncated {
        push(TRUNCATED);
    }
    // Frames are stored leaf first; folded stacks are root first.
    for frame in stack.frames.iter().rev() {
        push(names.frame(frame));
    }
    if stack.frames.is_empty() {
        push(NO_STACK);
    }
}

/// Makes a name safe inside a folded line, where a traced program chooses
/// the names (symbols, argv[0]):
/// - control characters, backslashes and invalid text are escaped as in the
///   text report (`escape::text`: a newline becomes `\n`), so a name can
///   neither end the line nor reach a terminal raw;
/// - `;` separates frames: it becomes `:` (C++ and Rust names hold it, as
///   in `[u8; 8]`, and `[u8: 8]` reads better than an escape);
/// - a name ending in a space and a number (`f 12`, `f 1.5`) would be read
///   as a sample count, the line as a differential one (`stack A B`, as
///   inferno and flamegraph.pl read it): that space becomes `\x20`.
pub fn sanitize(name: &str) -> String {
    let escaped: String = escape::text(name)
        .chars()
        .map(|c| if c == ';' { ':' } else { c })
        .collect();
    match escaped.rsplit_once(' ') {
        Some((head, tail))
            if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '.') =>
        {
            format!("{head}\\x20{tail}")
        }
        _ => escaped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_keeps_frames_apart() {
        assert_eq!(sanitize("f<[u8; 8]>\n"), "f<[u8: 8]>\\n");
        assert_eq!(sanitize("a\x1b[2Jb\\"), "a\\x1b[2Jb\\\\");
    }

    #[test]
    fn sanitize_keeps_a_trailing_number_out_of_the_count() {
        assert_eq!(sanitize("f 12"), "f\\x2012");
        assert_eq!(sanitize("f 1.5"), "f\\x201.5");
        assert_eq!(
            sanitize("operator new(unsigned long)"),
            "operator new(unsigned long)"
        );
        assert_eq!(sanitize("[unknown] lib.so+0x10"), "[unknown] lib.so+0x10");
    }

    #[test]
    fn a_forged_line_stays_one_stack() {
        let p = Profile {
            stacks: vec![StackReport {
                pid: 1,
                start_time: None,
                exited_group: None,
                counts: crate::report::Counts {
                    inuse_bytes: 7,
                    ..Default::default()
                },
                frames: vec![crate::report::Frame {
                    function: "leaf 5\nmain;evil 999999".into(),
                    ..Default::default()
                }
                .into()]
                .into(),
                truncated: false,
                series: Vec::new(),
                growth_bytes_per_sec: None,
                trend: None,
                temporary: None,
            }],
            ..Default::default()
        };
        let mut out = Vec::new();
        write_collapsed(&p, View::InuseSpace, &mut out).expect("render");
        let out = String::from_utf8(out).expect("utf-8");
        assert_eq!(out, "leaf 5\\nmain:evil\\x20999999 7\n");
    }
}
