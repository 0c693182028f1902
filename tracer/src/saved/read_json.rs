//! Reads a saved `--format json` profile (`memtrace-bpf/2`, report/json.rs)
//! back into a `Profile`. Fields added after version 2 (history, min age)
//! are read when present and default when absent; every frame index is
//! checked against the `frames` table, and the memory the document takes
//! is estimated and spent from a `Budget` before it is parsed.

use std::mem::size_of;

use anyhow::{bail, Context as _};
use serde::Deserialize;

use super::limits::Budget;
use crate::report::{Frame, Hook, ProcessInfo, Profile, StackReport};

mod doc;

use doc::{Doc, FrameDoc, HookDoc, ProcessDoc, StackDoc};

/// The version this reader understands (report/json.rs `FORMAT`).
const FORMAT: &str = "memtrace-bpf/2";

/// Parses `raw` as a memtrace-bpf JSON profile, within `budget`.
pub fn parse(raw: Vec<u8>, budget: &mut Budget) -> anyhow::Result<Profile> {
    budget.spend(decoded_size(&raw))?;
    let doc = parse_doc(&raw)?;
    drop(raw);
    check_format(doc.format.clone())?;
    doc.into_profile(budget)
}

/// Bytes the parsed document and the profile made from it take, at most:
/// every object (`{`) as the largest struct it can become, twice (the
/// document's and the profile's), every array element or member (`[`,
/// `,`) as an index and the frame pointer it becomes, and a copy of every
/// string. A JSON value is at least 2 bytes, so this is what bounds a
/// file of `[{},{},...]`.
fn decoded_size(raw: &[u8]) -> usize {
    const OBJECT: usize = max(
        max(
            size_of::<StackDoc>() + size_of::<StackReport>(),
            size_of::<FrameDoc>() + size_of::<Frame>() + 3 * size_of::<usize>(),
        ),
        max(
            size_of::<ProcessDoc>() + size_of::<ProcessInfo>(),
            size_of::<HookDoc>() + size_of::<Hook>(),
        ),
    );
    const ELEMENT: usize = 2 * size_of::<u64>();
    let (mut objects, mut elements) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in raw {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' => objects += 1,
            b'[' | b',' => elements += 1,
            _ => {}
        }
    }
    raw.len()
        .saturating_add(objects.saturating_mul(OBJECT))
        .saturating_add(elements.saturating_mul(ELEMENT))
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

fn parse_doc(raw: &[u8]) -> anyhow::Result<Doc> {
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
        Some(FORMAT) => Ok(()),
        Some(diff) if diff.starts_with("memtrace-bpf-diff/") => bail!(
            "it is a diff ({diff:?}, from `memtrace-bpf diff --format json`), not a profile: \
             report and diff read the profiles a trace saves"
        ),
        Some(other) => bail!(
            "its format is {:?}; this memtrace-bpf reads {FORMAT:?} (re-save it with a matching \
             memtrace-bpf, or use that version's `report`)",
            other
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
