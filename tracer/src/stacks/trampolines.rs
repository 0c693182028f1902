//! CPython's perf trampolines (3.12 and later, `python -X perf` and
//! `-X perf_jit`): before the eval loop runs a Python function, it calls
//! the function's own copy of `Python/asm_trampoline.S`, whose address
//! the perf map (or jitdump) names after the function. The copies sit in
//! anonymous executable memory, arenas of 64 KiB filled with copies at a
//! fixed stride before they are made executable, and keep no frame
//! pointer: on x86-64 a copy is
//!
//! ```text
//! [endbr64]            f3 0f 1e fa   (a CET build)
//! sub  $8, %rsp        48 83 ec 08   CFA = RSP + 8 before it
//! call *%rcx           ff d1         CFA = RSP + 16 from here
//! add  $8, %rsp        48 83 c4 08   (the return address)
//! ret                  c3            CFA = RSP + 8
//! ```
//!
//! then padding (none in 3.12: copies 11 bytes apart; zeros to 16 in
//! 3.13). The frame-pointer step that anonymous executable memory gets
//! otherwise reads RBP, which the eval loop (built without frame pointers)
//! holds as data: every stack ended at the first Python frame.
//!
//! Here an anonymous executable range is read (bounded, from
//! `/proc/PID/mem`) when it is first seen, and if it holds nothing but
//! trampoline copies and zero padding, its runs of copies at one stride
//! are described by rows of the rules above: for the kernel's walker, a
//! table per shape (one copy's layout and stride) shared by every run of
//! that shape (`kernel_tables/trampolines.rs`); for framehop, the same
//! rule applied directly (`unwind.rs`). Python's own code (the eval loop
//! above, `_PyEval_Vector` below) has CFI as any library does.
//!
//! ```ignore
//! let mut jit = JitCode::default();
//! jit.update(pid, parse_jit(&maps_text)); // reads the ranges new since
//! for span in jit.trampolines() {
//!     let cfa = sp + span.shape.cfa_offset(return_address - 1 - span.range.start);
//! }
//! ```

use std::{ops::Range, os::unix::fs::FileExt as _};

use super::unwind_table::{BuildStats, Cfa, Fp, Row, Rule, UnwindTable};

/// One trampoline copy without the endbr64 a CET build puts first:
/// `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`.
const CODE: [u8; 11] = [
    0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
];
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Offsets in a copy (after the endbr64, if any) where the CFA rule
/// changes: after the `sub`, after the `add`.
const AFTER_SUB: u64 = 4;
const AFTER_ADD: u64 = 10;

/// Copies further apart than this are not one run (CPython pads a copy
/// to 16 bytes at most).
const MAX_STRIDE: u64 = 64;

/// One shape's table covers this much: one CPython arena. A longer run
/// (arenas mapped next to each other, merged into one mapping) is
/// described as several spans, each starting at a copy, sharing the
/// table.
const TABLE_SPAN: u64 = 64 << 10;

/// An anonymous executable range larger than this is not read: CPython's
/// arenas are 64 KiB each, so this is 64 arenas merged into one mapping
/// (about 380,000 Python functions).
const MAX_SCAN: u64 = 4 << 20;

/// A trampoline copy's layout: with or without endbr64 first, and the
/// distance between copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape {
    pub endbr: bool,
    pub stride: u8,
}

/// A run of copies of one shape: the first at `range.start`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrampolineSpan {
    pub range: Range<u64>,
    pub shape: Shape,
}

impl Shape {
    fn prefix(self) -> u64 {
        if self.endbr {
            ENDBR64.len() as u64
        } else {
            0
        }
    }

    /// The CFA's offset from RSP at `offset` bytes into a span of this
    /// shape: RSP + 16 between the `sub` and the `add` (at the call's
    /// return address too), RSP + 8 elsewhere. The return address is at
    /// CFA - 8, RBP is never touched.
    pub fn cfa_offset(self, offset: u64) -> u64 {
        let at = (offset % u64::from(self.stride)).wrapping_sub(self.prefix());
        if (AFTER_SUB..AFTER_ADD).contains(&at) {
            16
        } else {
            8
        }
    }

    /// Copies in the shape's table.
    fn copies(self) -> u64 {
        TABLE_SPAN.div_ceil(u64::from(self.stride))
    }

    /// The rows of `copies()` copies from address 0 (the span's start is
    /// the load base); 2 per copy and 1.
    pub(crate) fn table(self) -> UnwindTable {
        let rule = |off| Rule {
            cfa: Cfa::Sp(off),
            fp: Fp::Same,
        };
        let mut rows = vec![Row {
            pc: 0,
            rule: rule(8),
        }];
        for k in 0..self.copies() {
            let at = k * u64::from(self.stride) + self.prefix();
            rows.push(Row {
                pc: at + AFTER_SUB,
                rule: rule(16),
            });
            rows.push(Row {
                pc: at + AFTER_ADD,
                rule: rule(8),
            });
        }
        UnwindTable {
            base: 0,
            rows,
            stats: BuildStats::default(),
        }
    }
}

/// The trampoline copy at the start of `bytes`, if there is one: whether
/// it has endbr64, and its length.
fn copy_at(bytes: &[u8]) -> Option<(bool, usize)> {
    if bytes.starts_with(&CODE) {
        return Some((false, CODE.len()));
    }
    let rest = bytes.strip_prefix(&ENDBR64)?;
    rest.starts_with(&CODE)
        .then_some((true, ENDBR64.len() + CODE.len()))
}

/// A run of copies being collected.
struct Run {
    at: u64,
    endbr: bool,
    stride: Option<u64>,
    last: u64,
}

/// The spans of trampolines in `bytes`, the memory at `start`: empty
/// unless it begins with a copy (arenas are mapped whole) and holds
/// nothing but copies and zero bytes.
pub fn recognise(bytes: &[u8], start: u64) -> Vec<TrampolineSpan> {
    let mut spans = Vec::new();
    if copy_at(bytes).is_none() {
        return spans;
    }
    let mut run: Option<Run> = None;
    let mut at = 0;
    while at < bytes.len() {
        let Some((endbr, len)) = copy_at(&bytes[at..]) else {
            if bytes[at] != 0 {
                return Vec::new();
            }
            at += 1;
            continue;
        };
        let pos = at as u64;
        let extends = run.as_ref().is_some_and(|r| {
            let gap = pos - r.last;
            r.endbr == endbr && r.stride.map_or(gap <= MAX_STRIDE, |s| gap == s)
        });
        match &mut run {
            Some(r) if extends => {
                r.stride.get_or_insert(pos - r.last);
                r.last = pos;
            }
            _ => {
                if let Some(r) = run.take() {
                    close(&r, pos, start, &mut spans);
                }
                run = Some(Run {
                    at: pos,
                    endbr,
                    stride: None,
                    last: pos,
                });
            }
        }
        at += len;
    }
    if let Some(r) = run {
        close(&r, bytes.len() as u64, start, &mut spans);
    }
    spans
}

/// Adds the spans of `run`, which covers up to `end` (the next run or the
/// range's end), each at most one table long.
fn close(run: &Run, end: u64, start: u64, spans: &mut Vec<TrampolineSpan>) {
    let len = if run.endbr { ENDBR64.len() } else { 0 } + CODE.len();
    let Ok(stride) = u8::try_from(run.stride.unwrap_or(len as u64)) else {
        return;
    };
    let shape = Shape {
        endbr: run.endbr,
        stride,
    };
    let chunk = shape.copies() * u64::from(stride);
    let mut at = run.at;
    while at < end {
        let to = (at + chunk).min(end);
        spans.push(TrampolineSpan {
            range: start + at..start + to,
            shape,
        });
        at = to;
    }
}

/// Reads the anonymous executable `range` of process `pid` and returns
/// its trampoline spans (empty: not trampolines, too large, unreadable).
/// Its first bytes are read first, so that other JIT code costs one
/// small read.
fn read(pid: u32, range: &Range<u64>) -> Vec<TrampolineSpan> {
    let len = range.end.saturating_sub(range.start);
    if len == 0 || len > MAX_SCAN {
        return Vec::new();
    }
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return Vec::new();
    };
    let mut head = [0u8; ENDBR64.len() + CODE.len()];
    let head = &mut head[..(len as usize).min(ENDBR64.len() + CODE.len())];
    if mem.read_exact_at(head, range.start).is_err() || copy_at(head).is_none() {
        return Vec::new();
    }
    let mut bytes = vec![0u8; len as usize];
    if mem.read_exact_at(&mut bytes, range.start).is_err() {
        return Vec::new();
    }
    recognise(&bytes, range.start)
}

/// Spans kept after the maps stopped showing them (`JitCode::retired`).
const MAX_RETIRED: usize = 64;

/// A process's anonymous executable ranges (JIT code) and the trampoline
/// spans found in them. Each range is read once, when the maps first show
/// it; a range replaced by other code at the very same addresses between
/// two reads of the maps keeps what was found (its walks may then end
/// early). Held per process, dropped with it; at most one span per 64 KiB
/// of the ranges read, and MAX_RETIRED more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JitCode {
    ranges: Vec<Range<u64>>,
    trampolines: Vec<TrampolineSpan>,
    /// Spans whose range the maps no longer show, newest last, none
    /// overlapping a range shown now. CPython unmaps its arenas as it
    /// exits, and a stack copied through them is unwound in user space
    /// after that when the tracer is behind (`--unwind dwarf`, a kernel
    /// walk resumed from a copy): at an address in no mapping now, such a
    /// walk still steps through them.
    retired: std::collections::VecDeque<TrampolineSpan>,
}

impl JitCode {
    /// No ranges.
    pub const EMPTY: JitCode = JitCode {
        ranges: Vec::new(),
        trampolines: Vec::new(),
        retired: std::collections::VecDeque::new(),
    };

    /// Takes the ranges the maps show now (sorted, as the maps are), and
    /// reads those not seen before; whether anything changed.
    pub fn update(&mut self, pid: u32, ranges: Vec<Range<u64>>) -> bool {
        self.update_with(ranges, |r| read(pid, r))
    }

    pub(crate) fn update_with(
        &mut self,
        ranges: Vec<Range<u64>>,
        mut read: impl FnMut(&Range<u64>) -> Vec<TrampolineSpan>,
    ) -> bool {
        if ranges == self.ranges {
            return false;
        }
        let mut trampolines = Vec::new();
        for r in &ranges {
            let seen = self.ranges.binary_search_by_key(&r.start, |o| o.start);
            if seen.is_ok_and(|i| self.ranges[i].end == r.end) {
                let within = |t: &&TrampolineSpan| r.contains(&t.range.start);
                trampolines.extend(self.trampolines.iter().filter(within).cloned());
            } else {
                trampolines.extend(read(r));
            }
        }
        let shown = |t: &TrampolineSpan| {
            let i = ranges.partition_point(|r| r.end <= t.range.start);
            ranges.get(i).is_some_and(|r| r.start < t.range.end)
        };
        let gone = std::mem::take(&mut self.trampolines);
        self.retired.extend(gone.into_iter().filter(|t| !shown(t)));
        self.retired.retain(|t| !shown(t));
        let excess = self.retired.len().saturating_sub(MAX_RETIRED);
        self.retired.drain(..excess);
        self.ranges = ranges;
        self.trampolines = trampolines;
        true
    }

    /// `ranges` with these trampolines found in them (the tests).
    #[cfg(test)]
    pub(crate) fn with(ranges: Vec<Range<u64>>, trampolines: Vec<TrampolineSpan>) -> JitCode {
        JitCode {
            ranges,
            trampolines,
            ..JitCode::default()
        }
    }

    /// The anonymous executable ranges, sorted.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// The trampoline spans, sorted, each inside one of `ranges`.
    pub fn trampolines(&self) -> &[TrampolineSpan] {
        &self.trampolines
    }

    /// The trampoline span holding `pc`.
    pub fn trampoline_at(&self, pc: u64) -> Option<&TrampolineSpan> {
        let i = self.trampolines.partition_point(|t| t.range.start <= pc);
        self.trampolines[..i]
            .last()
            .filter(|t| t.range.contains(&pc))
    }

    /// The span the maps showed at `pc` before they stopped showing it:
    /// for an address in no mapping now.
    pub fn retired_at(&self, pc: u64) -> Option<&TrampolineSpan> {
        self.retired.iter().rev().find(|t| t.range.contains(&pc))
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Forgets everything (the process exec'ed).
    pub fn clear(&mut self) {
        *self = JitCode::default();
    }
}

#[cfg(test)]
mod tests;
