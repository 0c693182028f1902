//! Collapsed ("folded") stacks: `root;...;leaf VALUE`, one line per unique
//! stack, the input format of inferno, flamegraph.pl and speedscope.
//!
//! A line is held as the ids of its names, not as text: a profile of 7 M
//! frame references with names of 100 bytes would be 700 MB of text, and
//! is 28 MB of ids. The text is written as it goes; only the flamegraph,
//! which inferno draws from whole lines, makes it (`folded_lines`).

use std::cmp::Ordering;
use std::collections::HashMap;
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
    for (ids, value) in folded.lines() {
        folded.write_stack(ids, w)?;
        writeln!(w, " {value}")?;
    }
    Ok(())
}

/// The collapsed lines without newlines, sorted, each one string: what
/// inferno draws the flamegraph from. The text is as large as the names
/// of every frame reference: `folded_text_bytes` says how large first.
pub(super) fn folded_lines(p: &Profile, view: View) -> FoldedLines {
    let folded = Folded::new(p, view);
    let mut text = Vec::with_capacity(folded.text_bytes());
    let mut lines = Vec::with_capacity(folded.lines.len());
    for (ids, value) in folded.lines() {
        let start = text.len();
        // Writing to a Vec cannot fail.
        let _ = folded.write_stack(ids, &mut text);
        let _ = write!(text, " {value}");
        lines.push(start..text.len());
    }
    // Every name is a String and the rest ASCII.
    let text = String::from_utf8(text).unwrap_or_default();
    FoldedLines { text, lines }
}

/// The bytes `folded_lines` of `view` would take, at most (stacks that
/// print alike are merged there, and counted apart here).
pub fn folded_text_bytes(p: &Profile, view: View) -> usize {
    let multi = p.is_multi_process();
    let mut names = Names::default();
    let mut ids = Vec::new();
    let mut total = 0usize;
    for stack in p.stacks.iter().filter(|s| view.value(&s.counts) > 0) {
        ids.clear();
        push_stack(p, stack, multi, &mut names, &mut ids);
        let line: usize = ids
            .iter()
            .map(|&id| names.text[id as usize].len() + 1)
            .sum();
        // `;` between names, ` VALUE` after: at most 21 bytes.
        total = total.saturating_add(line + 20);
    }
    total
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

/// Each distinct `root;...;leaf` with its summed value, sorted. Every
/// line's name ids are in one list, one line after another: 100 k stacks
/// cost a few dozen allocations rather than 100 k (and while the report is
/// written, every allocation of the tracer traps through the allocator
/// probes, which stay attached until it is done).
struct Folded {
    names: Names,
    /// Every line's name ids, root first.
    ids: Vec<u32>,
    /// (line in `ids`, value), sorted by line, each line once.
    lines: Vec<(Range<usize>, u64)>,
}

impl Folded {
    fn new(p: &Profile, view: View) -> Folded {
        let multi = p.is_multi_process();
        let mut names = Names::default();
        let mut ids = Vec::new();
        let mut lines = Vec::new();
        for stack in &p.stacks {
            let value = view.value(&stack.counts);
            if value == 0 {
                continue;
            }
            let start = ids.len();
            push_stack(p, stack, multi, &mut names, &mut ids);
            lines.push((start..ids.len(), value));
        }
        lines.sort_unstable_by(|(a, _), (b, _)| names.cmp_lines(&ids[a.clone()], &ids[b.clone()]));
        // Stacks that differ only in offsets render identically (names are
        // interned by text): inferno would draw them as one frame anyway,
        // so merge them into one line.
        lines.dedup_by(|(next, value), (kept, sum)| {
            let same = ids[next.clone()] == ids[kept.clone()];
            if same {
                *sum = sum.saturating_add(*value);
            }
            same
        });
        Folded { names, ids, lines }
    }

    fn lines(&self) -> impl Iterator<Item = (&[u32], u64)> {
        self.lines
            .iter()
            .map(|(range, value)| (&self.ids[range.clone()], *value))
    }

    /// `root;...;leaf` of `ids`.
    fn write_stack(&self, ids: &[u32], w: &mut impl Write) -> io::Result<()> {
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                w.write_all(b";")?;
            }
            w.write_all(self.names.text[id as usize].as_bytes())?;
        }
        Ok(())
    }

    fn text_bytes(&self) -> usize {
        self.lines()
            .map(|(ids, _)| {
                let names: usize = ids
                    .iter()
                    .map(|&id| self.names.text[id as usize].len())
                    .sum();
                names + ids.len() + 20
            })
            .fold(0, usize::saturating_add)
    }
}

/// Sanitized names of frames (by pointer) and of process root frames (by
/// pid, start time and folded group), each made once and given an id; one
/// id per distinct text, so lines that print alike have equal ids.
#[derive(Default)]
struct Names {
    text: Vec<String>,
    by_text: HashMap<String, u32>,
    frames: PtrMap<u32>,
    processes: HashMap<(u32, Option<u64>, Option<String>), u32>,
    /// --group-by cgroup|container: each process's group, as a root frame.
    groups: HashMap<(u32, Option<u64>, Option<String>), u32>,
}

impl Names {
    fn intern(&mut self, name: String) -> u32 {
        if let Some(&id) = self.by_text.get(&name) {
            return id;
        }
        // 2^32 distinct names would take over 4 GiB of text alone.
        let id = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.text.push(name.clone());
        self.by_text.insert(name, id);
        id
    }

    fn frame(&mut self, frame: &Arc<Frame>) -> u32 {
        // The pointer is valid and unique while the profile is borrowed,
        // which outlives this cache.
        let ptr = Arc::as_ptr(frame);
        if let Some(&id) = self.frames.get(&ptr) {
            return id;
        }
        let id = self.intern(sanitize(&frame.display_name()));
        self.frames.insert(ptr, id);
        id
    }

    fn process(&mut self, p: &Profile, stack: &StackReport) -> u32 {
        let key = (stack.pid, stack.start_time, stack.exited_group.clone());
        if let Some(&id) = self.processes.get(&key) {
            return id;
        }
        let id = self.intern(sanitize(&p.stack_label(stack)));
        self.processes.insert(key, id);
        id
    }

    fn group(&mut self, p: &Profile, stack: &StackReport) -> Option<u32> {
        if p.group_by == super::GroupBy::Process {
            return None;
        }
        let key = (stack.pid, stack.start_time, stack.exited_group.clone());
        if let Some(&id) = self.groups.get(&key) {
            return Some(id);
        }
        let name = p
            .group_of(stack)
            .map(|g| sanitize(&g.group))
            .unwrap_or_default();
        let id = self.intern(name);
        self.groups.insert(key, id);
        Some(id)
    }

    /// The order of the lines' text, `a;b;c` as bytes. Up to the first
    /// name that differs the text is equal; there, the names decide, or
    /// when one is the start of the other, what follows it: `;` when a
    /// frame does, which no name holds, or the end of the line, first.
    fn cmp_lines(&self, left: &[u32], right: &[u32]) -> Ordering {
        let Some(at) = left.iter().zip(right).position(|(l, r)| l != r) else {
            return left.len().cmp(&right.len());
        };
        let name = |ids: &[u32]| self.text[ids[at] as usize].as_bytes();
        let (l_name, r_name) = (name(left), name(right));
        let common = l_name.len().min(r_name.len());
        l_name[..common].cmp(&r_name[..common]).then_with(|| {
            let follows = |name: &[u8], ids: &[u32]| {
                name.get(common)
                    .copied()
                    .or((at + 1 < ids.len()).then_some(b';'))
            };
            follows(l_name, left).cmp(&follows(r_name, right))
        })
    }
}

/// Appends the ids of `root;...;leaf` to `out`, with a process root frame
/// when several processes share the profile, under the process's group's
/// frame with --group-by cgroup or container.
fn push_stack(
    p: &Profile,
    stack: &StackReport,
    multi: bool,
    names: &mut Names,
    out: &mut Vec<u32>,
) {
    if let Some(group) = names.group(p, stack) {
        out.push(group);
    }
    if multi {
        out.push(names.process(p, stack));
    }
    if stack.truncated {
        out.push(names.intern(TRUNCATED.to_string()));
    }
    // Frames are stored leaf first; folded stacks are root first.
    for frame in stack.frames.iter().rev() {
        out.push(names.frame(frame));
    }
    if stack.frames.is_empty() {
        out.push(names.intern(NO_STACK.to_string()));
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

    /// Lines come out in the order of their text, as when each was one
    /// string, though they are sorted as name ids: names that start
    /// another (`f`, `f2`: `2` sorts before `;`) and stacks that start
    /// another, and stacks alike but for offsets merged.
    #[test]
    fn lines_sort_as_their_text_and_alike_stacks_merge() {
        const NAMES: [&str; 7] = ["f", "f2", "f!", "g", "f:x", "fz", ""];
        let frames: Vec<Arc<Frame>> = (0..14)
            .map(|i| {
                Arc::new(Frame {
                    function: NAMES[i % NAMES.len()].into(),
                    module: "m".into(),
                    offset: i as u64,
                    ..Default::default()
                })
            })
            .collect();
        let mut state = 7u64;
        let stacks = (0..400)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let depth = 1 + (state >> 60) as usize % 4;
                let frames: Vec<Arc<Frame>> = (0..depth)
                    .map(|k| Arc::clone(&frames[(state >> (8 * k + 8)) as usize % frames.len()]))
                    .collect();
                StackReport {
                    pid: 1,
                    counts: crate::report::Counts {
                        inuse_bytes: 1,
                        ..Default::default()
                    },
                    frames: frames.into(),
                    ..Default::default()
                }
            })
            .collect();
        let p = Profile {
            stacks,
            ..Default::default()
        };
        let mut out = Vec::new();
        write_collapsed(&p, View::InuseSpace, &mut out).expect("render");
        let out = String::from_utf8(out).expect("utf-8");
        let lines: Vec<(&str, u64)> = out
            .lines()
            .map(|l| l.rsplit_once(' ').expect("STACK VALUE"))
            .map(|(stack, v)| (stack, v.parse().expect("a number")))
            .collect();
        let mut sorted: Vec<&str> = lines.iter().map(|(s, _)| *s).collect();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(lines.iter().map(|(s, _)| *s).collect::<Vec<_>>(), sorted);
        assert_eq!(lines.iter().map(|(_, v)| v).sum::<u64>(), 400);
        assert!(sorted.len() < 400, "stacks alike but for offsets merged");
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
