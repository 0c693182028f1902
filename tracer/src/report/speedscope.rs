//! `--format speedscope`: speedscope's own file format
//! (https://www.speedscope.app/file-format-schema.json). One `sampled`
//! profile per view (in-use bytes and objects, allocated bytes and
//! objects), and per process when several share the profile, named so a
//! person can tell them apart; frames shared by all, one per function and file, with a line in it.
//! Each stack is one sample, root first, weighted by the view's number;
//! `--view` picks the profile shown first.
//!
//! Names are exact (JSON escapes them; speedscope shows them as text).

use std::{collections::HashMap, io::Write, sync::Arc};

use anyhow::Context as _;
use serde::Serialize;

use super::{json::PtrMap, Frame, Profile, StackReport, View, NO_STACK, TRUNCATED};

const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

const VIEWS: [View; 6] = [
    View::InuseSpace,
    View::InuseObjects,
    View::AllocSpace,
    View::AllocObjects,
    View::PeakSpace,
    View::PeakObjects,
];

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile<'a>>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<SsFrame<'a>>,
}

#[derive(Serialize)]
struct SsFrame<'a> {
    name: std::borrow::Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct SampledProfile<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    /// Each a stack's indices in the list all the views share.
    samples: Vec<&'a [u32]>,
    weights: Vec<u64>,
}

/// Writes `p` in speedscope's format; `view`'s profile is shown first.
pub fn write_speedscope(p: &Profile, view: View, w: &mut impl Write) -> anyhow::Result<()> {
    let mut frames = Frames::default();
    // Each stack's frame indices once, root first, shared by the views:
    // all in one list (100 k stacks, six views: 700 k lists before).
    let mut indices = Vec::with_capacity(p.stacks.len() * 18);
    let ranges: Vec<std::ops::Range<usize>> = p
        .stacks
        .iter()
        .map(|s| {
            let start = indices.len();
            frames.stack_into(&mut indices, s);
            start..indices.len()
        })
        .collect();
    let stacks: Vec<&[u32]> = ranges.into_iter().map(|r| &indices[r]).collect();
    // The processes in the order their first stack appears.
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    let mut group_of: HashMap<String, usize> = HashMap::new();
    let multi = p.is_multi_process();
    for (i, stack) in p.stacks.iter().enumerate() {
        let label = if multi {
            p.stack_label(stack)
        } else {
            String::new()
        };
        let g = *group_of.entry(label.clone()).or_insert_with(|| {
            groups.push((label, Vec::new()));
            groups.len() - 1
        });
        groups[g].1.push(i);
    }
    let mut profiles = Vec::new();
    let mut active = 0;
    // Files read back from before peaks were tracked have none: no empty
    // peak profiles then.
    let has_peak = p.stacks.iter().any(|s| s.counts.peak_inuse_objects > 0);
    for v in VIEWS {
        if matches!(v, View::PeakSpace | View::PeakObjects) && !has_peak && v != view {
            continue;
        }
        if v == view {
            active = profiles.len();
        }
        for (label, members) in &groups {
            profiles.push(profile(p, v, label, members, &stacks));
        }
    }
    let file = File {
        schema: SCHEMA,
        shared: Shared {
            frames: frames.list,
        },
        profiles,
        name: format!("memtrace-bpf: {}", p.target),
        active_profile_index: active,
        exporter: format!("memtrace-bpf {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_writer(&mut *w, &file).context("writing the speedscope file")?;
    writeln!(w).context("writing the speedscope file")?;
    Ok(())
}

/// One view of one process (or of all, `label` empty): a sample per stack
/// with a non-zero value.
fn profile<'a>(
    p: &Profile,
    view: View,
    label: &str,
    members: &[usize],
    stacks: &[&'a [u32]],
) -> SampledProfile<'a> {
    let mut samples = Vec::new();
    let mut weights = Vec::new();
    for &i in members {
        let value = view.value(&p.stacks[i].counts);
        if value > 0 {
            samples.push(stacks[i]);
            weights.push(value);
        }
    }
    let name = match label {
        "" => view.describe().to_string(),
        label => format!("{}: {label}", view.describe()),
    };
    SampledProfile {
        kind: "sampled",
        name,
        unit: match view {
            View::InuseSpace | View::AllocSpace | View::PeakSpace => "bytes",
            View::InuseObjects | View::AllocObjects | View::PeakObjects => "none",
        },
        start_value: 0,
        end_value: weights.iter().fold(0u64, |a, &b| a.saturating_add(b)),
        samples,
        weights,
    }
}

/// The shared frame list: each distinct frame (by pointer) once, plus the
/// `[truncated]` and `[no stack]` markers. Stacks hold 4-byte indices into
/// it: a profile of 7 M frame references holds 28 MB of them.
#[derive(Default)]
struct Frames<'a> {
    list: Vec<SsFrame<'a>>,
    by_ptr: PtrMap<u32>,
    /// Equal frames in distinct `Arc`s (a process's own copy) share one.
    by_value: HashMap<(String, Option<&'a str>), u32>,
    markers: HashMap<&'static str, u32>,
}

impl<'a> Frames<'a> {
    /// `stack`'s frames as indices, root first, added to `out`.
    fn stack_into(&mut self, out: &mut Vec<u32>, stack: &'a StackReport) {
        if stack.truncated {
            out.push(self.marker(TRUNCATED));
        }
        out.extend(stack.frames.iter().rev().map(|f| self.frame(f)));
        if stack.frames.is_empty() {
            out.push(self.marker(NO_STACK));
        }
    }

    fn frame(&mut self, f: &'a Arc<Frame>) -> u32 {
        if let Some(&i) = self.by_ptr.get(&Arc::as_ptr(f)) {
            return i;
        }
        // speedscope takes name, file and line together as a frame's
        // identity: with each call site's own line, one function would be
        // several frames (split in the sandwich and left-heavy views). One
        // frame per function and file, at the lowest line seen in it: the
        // nearest to its head this profile knows.
        let key = (f.display_name(), f.file.as_deref());
        let next = self.next_index();
        let i = *self.by_value.entry(key.clone()).or_insert(next);
        if i == next {
            self.list.push(SsFrame {
                name: key.0.into(),
                file: key.1,
                line: f.line,
            });
        } else if let Some(line) = f.line {
            let known = &mut self.list[i as usize].line;
            *known = Some(known.map_or(line, |k| k.min(line)));
        }
        self.by_ptr.insert(Arc::as_ptr(f), i);
        i
    }

    /// The index the next frame of the list gets.
    fn next_index(&self) -> u32 {
        // 2^32 distinct frames would take over 100 GiB of names.
        u32::try_from(self.list.len()).unwrap_or(u32::MAX)
    }

    fn marker(&mut self, name: &'static str) -> u32 {
        if let Some(&i) = self.markers.get(name) {
            return i;
        }
        let i = self.next_index();
        self.list.push(SsFrame {
            name: name.into(),
            file: None,
            line: None,
        });
        self.markers.insert(name, i);
        i
    }
}
