//! The JSON profile's shape as serde reads it, and how each part becomes
//! the `Profile`'s: frame indices checked, references spent from the budget.

use std::sync::Arc;

use anyhow::Context as _;
use serde::Deserialize;

use crate::profile::{OomKilled, Temporary};
use crate::report::{
    Counts, ExitStack, Frame, Hook, Losses, NotFreedAtExit, Peak, ProcessAllocator, ProcessInfo,
    Profile, SnapshotPoint, StackReport, Trend,
};
use crate::saved::limits::{self, Budget};

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct Doc {
    pub(super) format: Option<String>,
    target: String,
    duration_secs: f64,
    /// Absent from files written before the start was kept.
    start_unix_ns: Option<u64>,
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
    losses: Losses,
    notes: Vec<String>,
    frames: Vec<FrameDoc>,
    oom_kills: u64,
    temporary: Option<TemporaryDoc>,
    /// How the trace grouped its report; anything unknown is `process`.
    group_by: Option<String>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct TemporaryDoc {
    objects: u64,
    bytes: u64,
}

impl TemporaryDoc {
    fn temporary(self) -> Temporary {
        Temporary {
            objects: self.objects,
            bytes: self.bytes,
        }
    }
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct OomDoc {
    secs: f64,
    inuse_bytes: u64,
    inuse_objects: u64,
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
pub(super) struct ProcessDoc {
    pid: u32,
    start_time: Option<u64>,
    command: String,
    program: String,
    exited: bool,
    exit_status: Option<String>,
    allocators: Vec<AllocatorDoc>,
    folded: u64,
    oom_killed: Option<OomDoc>,
    temporary: Option<TemporaryDoc>,
    cgroup: Option<String>,
    container_id: Option<String>,
    pod_uid: Option<String>,
    unit: Option<String>,
    ns_pid: Option<u32>,
    ns_program: Option<String>,
    /// Absent from files written before peaks were tracked.
    peak: Option<PeakDoc>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct PeakDoc {
    secs: Option<f64>,
    inuse_bytes: u64,
    inuse_objects: u64,
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
pub(super) struct HookDoc {
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
    peak_inuse_bytes: u64,
    peak_inuse_objects: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct StackDoc {
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
    temporary_objects: Option<u64>,
    temporary_bytes: Option<u64>,
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

#[derive(Deserialize, Default)]
#[serde(default)]
pub(super) struct FrameDoc {
    function: String,
    module: String,
    offset: u64,
    file: Option<String>,
    line: Option<u32>,
    inlined: bool,
    /// Absent in files written before frames carried it.
    build_id: Option<String>,
}

impl Doc {
    pub(super) fn into_profile(self, budget: &mut Budget) -> anyhow::Result<Profile> {
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
            start_unix_ns: self.start_unix_ns,
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
            losses: self.losses,
            notes: self
                .notes
                .into_iter()
                .map(crate::profile::Note::Text)
                .collect(),
            snapshots,
            min_age_secs: self.min_age_secs,
            oom_kills: self.oom_kills,
            temporary: self.temporary.map(TemporaryDoc::temporary),
            // As the trace grouped it; `report --group-by` may change it.
            group_by: match self.group_by.as_deref() {
                Some("cgroup") => crate::profile::GroupBy::Cgroup,
                Some("container") => crate::profile::GroupBy::Container,
                _ => crate::profile::GroupBy::Process,
            },
        })
    }
}

/// The frames that `indices` name in `table`, each index checked and each
/// reference's renderer cost spent from `budget` (the pointer is in the
/// count of the element it is read from, the table's names in the
/// input's).
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
            budget.spend(limits::RENDER_COST)?;
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
            oom_killed: self.oom_killed.map(|o| OomKilled {
                secs: o.secs,
                inuse_bytes: o.inuse_bytes,
                inuse_objects: o.inuse_objects,
            }),
            temporary: self.temporary.map(TemporaryDoc::temporary),
            identity: crate::profile::Identity {
                cgroup: self.cgroup,
                container_id: self.container_id,
                pod_uid: self.pod_uid,
                unit: self.unit,
                ns_pid: self.ns_pid,
                ns_program: self.ns_program,
            },
            peak: self.peak.map(|p| Peak {
                // Checked with the other numbers (saved/limits.rs).
                secs: p.secs,
                inuse_bytes: p.inuse_bytes,
                inuse_objects: p.inuse_objects,
            }),
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
            peak_inuse_bytes: self.peak_inuse_bytes,
            peak_inuse_objects: self.peak_inuse_objects,
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
            frames: frames(&self.frames, table, budget)?.into(),
            truncated: self.truncated,
            series: self.series,
            growth_bytes_per_sec: self.growth_bytes_per_sec,
            trend: self.trend,
            temporary: self.temporary_objects.map(|objects| Temporary {
                objects,
                bytes: self.temporary_bytes.unwrap_or(0),
            }),
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

impl FrameDoc {
    fn into_frame(self) -> Arc<Frame> {
        Arc::new(Frame {
            function: self.function,
            module: self.module,
            offset: self.offset,
            file: self.file,
            line: self.line,
            inlined: self.inlined,
            build_id: self.build_id.map(Arc::from),
        })
    }
}
