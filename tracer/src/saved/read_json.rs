//! Reads a saved `--format json` profile (`memtrace-bpf/2`, report/json.rs)
//! back into a `Profile`. Fields added after version 2 (history, min age)
//! are read when present and default when absent; every frame index is
//! checked against the `frames` table, and the memory the document takes
//! is estimated and spent from a `Budget` before it is parsed.

use std::{mem::size_of, sync::Arc};

use anyhow::{bail, Context as _};
use serde::Deserialize;

use super::limits::{self, Budget};
use crate::report::{
    Counts, ExitStack, Frame, Hook, Losses, NotFreedAtExit, Note, ProcessAllocator, ProcessInfo,
    Profile, SnapshotPoint, StackReport, Trend,
};

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

#[derive(Deserialize, Default)]
#[serde(default)]
struct Doc {
    format: Option<String>,
    target: String,
    duration_secs: f64,
    end_reason: String,
    sample_rate: u64,
    unwind: String,
    min_age_secs: Option<f64>,
    snapshots: Vec<PointDoc>,
    processes: Vec<ProcessDoc>,
    hooks: Vec<HookDoc>,
    totals: CountsDoc,
    stacks: Vec<StackDoc>,
    not_freed_at_exit: AtExitDoc,
    losses: LossesDoc,
    notes: Vec<String>,
    frames: Vec<FrameDoc>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct PointDoc {
    secs: f64,
    inuse_bytes: u64,
    inuse_objects: u64,
    alloc_bytes: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ProcessDoc {
    pid: u32,
    start_time: Option<u64>,
    command: String,
    program: String,
    exited: bool,
    exit_status: Option<String>,
    allocators: Vec<AllocatorDoc>,
    folded: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AllocatorDoc {
    kind: String,
    path: String,
    resolves_malloc: bool,
    functions: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct HookDoc {
    function: String,
    module: String,
    offset: u64,
    probe_offset: u64,
    placement: String,
    status: String,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct CountsDoc {
    inuse_bytes: u64,
    inuse_objects: u64,
    alloc_bytes: u64,
    alloc_objects: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StackDoc {
    pid: u32,
    start_time: Option<u64>,
    exited_group: Option<String>,
    #[serde(flatten)]
    counts: CountsDoc,
    frames: Vec<u64>,
    truncated: bool,
    series: Vec<u64>,
    growth_bytes_per_sec: Option<f64>,
    trend: Option<Trend>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct AtExitDoc {
    processes: u64,
    bytes: u64,
    objects: u64,
    stacks: Vec<ExitStackDoc>,
    stacks_left_out: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ExitStackDoc {
    program: String,
    processes: u64,
    bytes: u64,
    objects: u64,
    frames: Vec<u64>,
    truncated: bool,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct LossesDoc {
    ringbuf_full: u64,
    live_map_full: u64,
    stack_lost: u64,
    unknown_frees: u64,
    return_without_entry: u64,
    inflight_full: u64,
    read_failed: u64,
    stale_inflight: u64,
    nested_lost: u64,
    frees_dropped: u64,
    frees_of_dropped_allocs: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct FrameDoc {
    function: String,
    module: String,
    offset: u64,
    file: Option<String>,
    line: Option<u32>,
    inlined: bool,
}

impl Doc {
    fn into_profile(self, budget: &mut Budget) -> anyhow::Result<Profile> {
        let table: Vec<Arc<Frame>> = self.frames.into_iter().map(FrameDoc::into_frame).collect();
        let snapshots = self.snapshots.iter().map(|s| s.point()).collect();
        let stacks = self
            .stacks
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                s.into_stack(&table, budget)
                    .with_context(|| format!("stack {i}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Profile {
            target: self.target,
            duration_secs: self.duration_secs,
            end_reason: self.end_reason,
            sample_rate: self.sample_rate,
            unwind: self.unwind,
            processes: self
                .processes
                .into_iter()
                .map(ProcessDoc::into_info)
                .collect(),
            hooks: self.hooks.into_iter().map(HookDoc::into_hook).collect(),
            totals: self.totals.counts(),
            stacks,
            not_freed_at_exit: self.not_freed_at_exit.into_section(&table, budget)?,
            losses: self.losses.losses(),
            notes: self.notes.into_iter().map(Note::Text).collect(),
            snapshots,
            min_age_secs: self.min_age_secs,
        })
    }
}

/// The frames that `indices` name in `table`, each index checked and its
/// names spent from `budget` (a stack may repeat a long name).
fn frames(
    indices: &[u64],
    table: &[Arc<Frame>],
    budget: &mut Budget,
) -> anyhow::Result<Vec<Arc<Frame>>> {
    indices
        .iter()
        .map(|&i| {
            let frame = usize::try_from(i)
                .ok()
                .and_then(|i| table.get(i))
                .with_context(|| {
                    format!(
                        "frame index {i} is out of range (the frames table has {} entries)",
                        table.len()
                    )
                })?;
            budget.spend(limits::reference_cost(frame))?;
            Ok(Arc::clone(frame))
        })
        .collect()
}

impl PointDoc {
    fn point(&self) -> SnapshotPoint {
        SnapshotPoint {
            secs: self.secs,
            inuse_bytes: self.inuse_bytes,
            inuse_objects: self.inuse_objects,
            alloc_bytes: self.alloc_bytes,
        }
    }
}

impl ProcessDoc {
    fn into_info(self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid,
            start_time: self.start_time,
            command: self.command,
            program: self.program,
            exited: self.exited,
            exit_status: self.exit_status,
            allocators: self
                .allocators
                .into_iter()
                .map(|a| ProcessAllocator {
                    kind: a.kind,
                    path: a.path,
                    resolves_malloc: a.resolves_malloc,
                    functions: a.functions,
                })
                .collect(),
            folded: self.folded,
        }
    }
}

impl HookDoc {
    fn into_hook(self) -> Hook {
        Hook {
            function: self.function,
            module: self.module,
            offset: self.offset,
            probe_offset: self.probe_offset,
            placement: self.placement,
            status: self.status,
        }
    }
}

impl CountsDoc {
    fn counts(self) -> Counts {
        Counts {
            inuse_bytes: self.inuse_bytes,
            inuse_objects: self.inuse_objects,
            alloc_bytes: self.alloc_bytes,
            alloc_objects: self.alloc_objects,
        }
    }
}

impl StackDoc {
    fn into_stack(self, table: &[Arc<Frame>], budget: &mut Budget) -> anyhow::Result<StackReport> {
        Ok(StackReport {
            pid: self.pid,
            start_time: self.start_time,
            exited_group: self.exited_group,
            counts: self.counts.counts(),
            frames: frames(&self.frames, table, budget)?,
            truncated: self.truncated,
            series: self.series,
            growth_bytes_per_sec: self.growth_bytes_per_sec,
            trend: self.trend,
        })
    }
}

impl AtExitDoc {
    fn into_section(
        self,
        table: &[Arc<Frame>],
        budget: &mut Budget,
    ) -> anyhow::Result<NotFreedAtExit> {
        let stacks = self
            .stacks
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                Ok(ExitStack {
                    program: s.program,
                    processes: s.processes,
                    bytes: s.bytes,
                    objects: s.objects,
                    frames: frames(&s.frames, table, budget)
                        .with_context(|| format!("not_freed_at_exit stack {i}"))?,
                    truncated: s.truncated,
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(NotFreedAtExit {
            processes: self.processes,
            bytes: self.bytes,
            objects: self.objects,
            stacks,
            stacks_left_out: self.stacks_left_out,
        })
    }
}

impl LossesDoc {
    fn losses(self) -> Losses {
        Losses {
            ringbuf_full: self.ringbuf_full,
            live_map_full: self.live_map_full,
            stack_lost: self.stack_lost,
            unknown_frees: self.unknown_frees,
            return_without_entry: self.return_without_entry,
            inflight_full: self.inflight_full,
            read_failed: self.read_failed,
            stale_inflight: self.stale_inflight,
            nested_lost: self.nested_lost,
            frees_dropped: self.frees_dropped,
            frees_of_dropped_allocs: self.frees_of_dropped_allocs,
        }
    }
}

impl FrameDoc {
    fn into_frame(self) -> Arc<Frame> {
        Arc::new(Frame {
            function: self.function,
            module: self.module,
            offset: self.offset,
            file: self.file,
            line: self.line,
            inlined: self.inlined,
        })
    }
}
