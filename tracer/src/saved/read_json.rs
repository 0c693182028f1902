//! Reads a saved `--format json` profile (report/json.rs) back into a
//! `Profile`, through the profile types' own `Deserialize`: version 2
//! (stacks' frames are indices into the `frames` table) and version 1
//! (frames written in place). Fields added since a file was written read
//! as their defaults; every frame index is checked against the table, and
//! the memory the document takes is estimated and spent from a `Budget`
//! before it is parsed.

use std::{convert::Infallible, mem::size_of, ops::Range, sync::Arc};

use anyhow::{bail, Context as _};
use serde::Deserialize;

use super::limits::{self, Budget};
use crate::profile::{Frame, Frames, ProcessInfo, Profile, StackReport, StackReportOf};
use crate::report::Hook;

mod written;

use written::{Written, WrittenFrames};

/// The version written today (report/json.rs `FORMAT`), and the versions
/// read.
const FORMAT: &str = "memtrace-bpf/2";
const READ: [&str; 2] = [FORMAT, "memtrace-bpf/1"];

/// Parses `raw` as a memtrace-bpf JSON profile, within `budget`.
pub fn parse(raw: Vec<u8>, budget: &mut Budget) -> anyhow::Result<Profile> {
    budget.spend(decoded_size(&raw))?;
    let doc = parse_doc(&raw)?;
    drop(raw);
    check_format(doc.format.clone())?;
    into_profile(doc, budget)
}

/// The profile with every list of frames resolved: slices of one list of
/// all the references (as a trace builds them, `Frames`), each index
/// checked against the table and each reference's renderer cost spent
/// from `budget` (the pointer is in the count of the element it is read
/// from, the table's names in the input's).
fn into_profile(doc: Written, budget: &mut Budget) -> anyhow::Result<Profile> {
    let Written { profile, table, .. } = doc;
    let refs = profile.stacks.iter().map(|s| s.frames.len()).sum::<usize>()
        + (profile.not_freed_at_exit.stacks.iter())
            .map(|s| s.frames.len())
            .sum::<usize>();
    let mut all: Vec<Arc<Frame>> = Vec::with_capacity(refs);
    let ranges = profile.map_frames(&mut |frames, at| {
        resolve(frames, &table, &mut all, budget).with_context(|| at.to_string())
    })?;
    let all = Arc::new(all);
    let resolved =
        ranges.map_frames(&mut |at: Range<usize>, _| Ok::<_, Infallible>(Frames::part(&all, at)));
    match resolved {
        Ok(p) => Ok(p),
        Err(never) => match never {},
    }
}

/// Appends the frames of one list to `all`; where they are in it.
fn resolve(
    frames: WrittenFrames,
    table: &[Arc<Frame>],
    all: &mut Vec<Arc<Frame>>,
    budget: &mut Budget,
) -> anyhow::Result<Range<usize>> {
    let start = all.len();
    match frames {
        WrittenFrames::Indices(indices) => {
            for i in indices {
                let frame = table.get(i as usize).with_context(|| {
                    format!(
                        "frame index {i} is out of range (the frames table has {} entries)",
                        table.len()
                    )
                })?;
                budget.spend(limits::RENDER_COST)?;
                all.push(Arc::clone(frame));
            }
        }
        WrittenFrames::InPlace(frames) => {
            for frame in frames {
                budget.spend(limits::RENDER_COST)?;
                all.push(Arc::new(frame));
            }
        }
    }
    Ok(start..all.len())
}

/// Bytes the parsed document and the profile made from it take, at most:
/// every object (`{`) as the structs it becomes: in the top-level
/// `stacks`, `frames`, `processes` and `hooks` as theirs, elsewhere as the
/// largest; every array element (`[`, and `,` in an array) as an index
/// and the frame pointer it becomes; and a copy of every string. A JSON
/// value is at least 2 bytes, so this is what bounds a file of
/// `[{},{},...]`.
fn decoded_size(raw: &[u8]) -> usize {
    // A stack as read, as its frames are resolved, and as the profile's.
    const STACK: usize = size_of::<StackReportOf<WrittenFrames>>()
        + size_of::<StackReportOf<Range<usize>>>()
        + size_of::<StackReport>();
    // A table frame: the frame, its `Arc`'s counts, the table's pointer.
    const FRAME: usize = size_of::<Frame>() + 3 * size_of::<usize>();
    // A version 1 frame in place: as read, then in its `Arc`.
    const IN_PLACE: usize = size_of::<Frame>() + FRAME;
    // A process is read whole before its flattened identity (serde's
    // `flatten` buffers it), then as itself.
    const PROCESS: usize = 2 * size_of::<ProcessInfo>();
    const HOOK: usize = size_of::<Hook>();
    const OBJECT: usize = max(max(STACK, max(FRAME, IN_PLACE)), max(PROCESS, HOOK));
    const ELEMENT: usize = 2 * size_of::<u64>();
    let mut scan = Scan::default();
    let mut total = raw.len();
    for (at, &b) in raw.iter().enumerate() {
        let cost = match scan.byte(at, b) {
            Some(Token::Object) => match (scan.depth, scan.section(raw)) {
                (3, b"stacks") => STACK,
                (3, b"frames") => FRAME,
                (3, b"processes") => PROCESS,
                (3, b"hooks") => HOOK,
                _ => OBJECT,
            },
            Some(Token::Element) => ELEMENT,
            None => 0,
        };
        total = total.saturating_add(cost);
    }
    total
}

/// What `decoded_size` counts.
enum Token {
    Object,
    Element,
}

/// Where a scan of JSON is: in a string or not, how deep, whether each of
/// the innermost containers is an array, and the last key of the
/// top-level object (the section an array there is).
#[derive(Default)]
struct Scan {
    in_string: bool,
    escaped: bool,
    depth: usize,
    /// Bit `d` is set when the container at depth `d` (1 is the
    /// document) is an array; deeper than 64 counts as one (serde_json
    /// refuses more than 128 levels anyway).
    arrays: u64,
    string_start: usize,
    /// The last string at depth 1, and the section while inside its value.
    key: std::ops::Range<usize>,
    section: std::ops::Range<usize>,
}

impl Scan {
    fn byte(&mut self, at: usize, b: u8) -> Option<Token> {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => {
                    self.in_string = false;
                    if self.depth == 1 {
                        self.key = self.string_start..at;
                    }
                }
                _ => {}
            }
            return None;
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.string_start = at + 1;
                None
            }
            b'{' | b'[' => {
                if self.depth == 1 {
                    self.section = self.key.clone();
                }
                self.depth += 1;
                let bit = 1u64 << self.depth.min(63);
                if b == b'[' {
                    self.arrays |= bit;
                    Some(Token::Element)
                } else {
                    self.arrays &= !bit;
                    Some(Token::Object)
                }
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                None
            }
            b',' if self.arrays & (1u64 << self.depth.min(63)) != 0 => Some(Token::Element),
            _ => None,
        }
    }

    /// The top-level key whose value the scan is in.
    fn section<'a>(&self, raw: &'a [u8]) -> &'a [u8] {
        raw.get(self.section.clone()).unwrap_or_default()
    }
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

fn parse_doc(raw: &[u8]) -> anyhow::Result<Written> {
    match serde_json::from_slice(raw) {
        Ok(doc) => Ok(doc),
        Err(err) => {
            // A file of another version often fails on a field first: say
            // what the version is rather than which field.
            // (Only when the JSON itself is well-formed.)
            if let Ok(v) = serde_json::from_slice::<Version>(raw) {
                check_format(v.format)?;
            }
            Err(err).context("its JSON is malformed or not a memtrace-bpf profile")
        }
    }
}

fn check_format(format: Option<String>) -> anyhow::Result<()> {
    match format.as_deref() {
        Some(f) if READ.contains(&f) => Ok(()),
        Some(diff) if diff.starts_with("memtrace-bpf-diff/") => bail!(
            "it is a diff ({diff:?}, from `memtrace-bpf diff --format json`), not a profile: \
             report and diff read the profiles a trace saves"
        ),
        Some(other) => bail!(
            "its format is {other:?}; this memtrace-bpf reads {} (re-save it with a matching \
             memtrace-bpf, or use that version's `report`)",
            READ.map(|f| format!("{f:?}")).join(" and ")
        ),
        None => bail!(
            "it has no \"format\" field: not a JSON profile written by memtrace-bpf --format json"
        ),
    }
}

#[derive(Deserialize)]
struct Version {
    format: Option<String>,
}
