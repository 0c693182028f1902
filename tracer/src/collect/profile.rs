//! Turns the collector's state into a `profile::Profile`: symbolizes every
//! frame once, sums per-stack totals, and writes the notes a user needs.

use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

pub use super::meta::Meta;
use crate::{
    collect::stacks::Stack,
    collect::{
        collector::Collector, processes::ProcessIndex, profile_notes::Unnamed, state::State,
        timeline::Timeline,
    },
    model::heap::{InUse, StackHandle, Unfreed},
    profile::{
        Counts, ExitStack, Frame, Frames, Losses, NotFreedAtExit, Peak, Profile, StackReport,
        MAX_EXIT_STACKS,
    },
    stacks::modules::NormFrame,
    stacks::symbolize::Names,
};

/// The profile of what `collector` holds now; `names` keeps the frames
/// named for earlier snapshots.
pub fn build(meta: Meta, collector: &Collector, losses: Losses, names: &mut Names) -> Profile {
    let state = &collector.state;
    names.add(state.modules(), state.stacks().table.all_frames());
    let names = &*names;
    let mut meta = meta;
    let records: HashMap<RecordKey<'_>, ProcessIndex> = state
        .processes()
        .indexed()
        .map(|(i, r)| (record_key(r.pid, r.start_time, r.folded, &r.program), i))
        .collect();
    for p in &mut meta.processes {
        let key = record_key(p.pid, p.start_time, p.folded, &p.program);
        p.peak = records.get(&key).and_then(|&i| process_peak(state, i));
    }
    let timeline = state.history().as_ref().map(|h| {
        let now = (
            state.heap().inuse_bytes(),
            losses.get(tracer_common::counter::UNKNOWN_FREE_BYTES),
        );
        Timeline::new(h, meta.duration.as_secs_f64(), now)
    });
    let mut unnamed = Unnamed::default();
    let mut unfiltered = Counts::default();
    let stacks = stack_reports(
        &meta,
        state,
        names,
        timeline.as_ref(),
        &mut unnamed,
        &mut unfiltered,
    );
    let mut totals = Counts::default();
    for s in &stacks {
        add(&mut totals, &s.counts);
    }
    let temporary =
        super::oom_notes::fill_processes(&mut meta, state, &stacks, super::state::monotonic_ns());
    let not_freed_at_exit = not_freed_at_exit(collector, names);
    let mut notes = super::profile_notes::notes(
        &meta,
        collector,
        &losses,
        &stacks,
        &unnamed,
        &not_freed_at_exit,
    );
    notes.extend(names.symbol_notes(state.modules()));
    let snapshots = timeline
        .map(|t| t.snapshots(&unfiltered, meta.resident_now))
        .unwrap_or_default();
    let mut cgroup_memory = meta.cgroup_memory;
    super::growth_explained::fill(
        &mut meta.processes,
        cgroup_memory.as_mut(),
        &stacks,
        &snapshots,
        losses.get(tracer_common::counter::UNKNOWN_FREE_BYTES),
    );
    Profile {
        target: meta.target,
        duration_secs: meta.duration.as_secs_f64(),
        start_unix_ns: meta.started_unix_ns,
        end_reason: meta.end_reason,
        sample_rate: meta.sampling.rate(),
        unwind: meta.unwind.name().into(),
        processes: meta.processes,
        hooks: meta.hooks,
        totals,
        stacks,
        not_freed_at_exit,
        losses,
        notes,
        snapshots,
        min_age_secs: meta.min_age.map(|age| age.as_secs_f64()),
        oom_kills: state.oom().seen,
        temporary,
        // The session sets it (--group-by).
        group_by: crate::profile::GroupBy::Process,
        cgroup_memory,
    }
}

/// What tells a process record from another: a process by pid and start
/// time, a folded group by its program.
type RecordKey<'a> = (u32, Option<u64>, bool, &'a str);

fn record_key(pid: u32, start_time: Option<u64>, folded: u64, program: &str) -> RecordKey<'_> {
    match folded {
        0 => (pid, start_time, false, ""),
        _ => (pid, start_time, true, program),
    }
}

/// The peak of process record `i`, for the report.
fn process_peak(state: &State, i: ProcessIndex) -> Option<Peak> {
    let peak = state.process_peak(i)?;
    let (inuse_bytes, inuse_objects) = peak.rounded()?;
    Some(Peak {
        secs: peak
            .at_ns
            .map(|ns| ns.saturating_sub(state.started_ns()) as f64 / 1e9),
        inuse_bytes,
        inuse_objects,
    })
}

/// Every stack that allocated, as the report shows it, largest first.
/// `unfiltered` sums their counts before --min-age; `unnamed` counts the
/// stacks whose process went before their frames could be placed.
fn stack_reports(
    meta: &Meta,
    state: &State,
    names: &Names,
    timeline: Option<&Timeline>,
    unnamed: &mut Unnamed,
    unfiltered: &mut Counts,
) -> Vec<StackReport> {
    let unread = state.modules().unread();
    let aged = aged_inuse(meta, state);
    // Sized once: 100 k stacks grown by doubling would copy and briefly
    // hold them twice.
    let mut stacks: Vec<StackReport> = Vec::with_capacity(state.heap().stack_count());
    // Every stack's frames in one list, each stack a range of it: one
    // allocation for all of them, not one per stack. Grown in place (a
    // list this large is remapped, not copied).
    let mut all_frames: Vec<Arc<Frame>> = Vec::with_capacity(state.heap().stack_count() * 16);
    let mut ranges = Vec::with_capacity(state.heap().stack_count());
    // Until the list is shared: a stand-in that allocates nothing more.
    let no_frames = Frames::default();
    stacks.extend(
        state
            .heap()
            .stacks()
            .filter(|(_, c)| c.alloc_objects > 0)
            .filter_map(|(h, mut counts)| {
                let stack = state.stacks().table.get(h)?;
                let at_peak = state
                    .heap()
                    .stack_peak(h, state.process_peak(stack.process));
                (counts.peak_inuse_bytes, counts.peak_inuse_objects) =
                    (at_peak.bytes, at_peak.objects);
                // History and growth follow the whole heap: --min-age filters
                // only what the report counts as in use now.
                let growth = timeline
                    .map(|t| t.growth(h, &counts, meta.sampling))
                    .unwrap_or_default();
                add(unfiltered, &counts);
                if let Some(aged) = &aged {
                    let old = aged.get(&h).copied().unwrap_or_default();
                    (counts.inuse_bytes, counts.inuse_objects) = (old.bytes, old.objects);
                }
                if exited_early(state, unread, stack) {
                    unnamed.stacks += 1;
                    unnamed.pids.insert(stack.pid);
                    unnamed.truncated += u64::from(stack.truncated);
                }
                let start = all_frames.len();
                name_into(&mut all_frames, names, stack.frames.as_deref());
                ranges.push(start..all_frames.len());
                let frames = &all_frames[start..];
                Some(StackReport {
                    pid: stack.pid,
                    start_time: state
                        .processes()
                        .get(stack.process)
                        .and_then(|p| p.start_time),
                    exited_group: state
                        .processes()
                        .get(stack.process)
                        .filter(|p| p.folded > 0)
                        .map(|p| p.program.clone()),
                    counts,
                    truncated: super::roots::cut_short(frames, stack.truncated),
                    frames: no_frames.clone(),
                    series: growth.series,
                    growth_bytes_per_sec: growth.per_sec,
                    trend: growth.trend,
                    temporary: state.temporaries().as_ref().map(|t| t.of(h)),
                })
            }),
    );
    for (s, frames) in stacks.iter_mut().zip(Frames::share(all_frames, ranges)) {
        s.frames = frames;
    }
    let mut stacks = super::merge::same_frames(stacks);
    stacks.sort_unstable_by(|a, b| {
        (b.counts.inuse_bytes, b.counts.alloc_bytes)
            .cmp(&(a.counts.inuse_bytes, a.counts.alloc_bytes))
            .then_with(|| cmp_frames(&a.frames, &b.frames))
            .then_with(|| a.pid.cmp(&b.pid))
    });
    stacks
}

/// In use: blocks live at least --min-age, allocated since the window
/// opened, per stack; None when neither filters.
fn aged_inuse(meta: &Meta, state: &State) -> Option<HashMap<StackHandle, InUse>> {
    (meta.min_age.is_some() || meta.born_since_ns.is_some()).then(|| {
        let now = super::state::monotonic_ns();
        match now.checked_sub(meta.min_age.map_or(0, saturating_ns)) {
            Some(until) => state
                .heap()
                .inuse_born_between(meta.born_since_ns.unwrap_or(0), until),
            None => Default::default(),
        }
    })
}

/// A stack's frames as the report names them (inlined functions are
/// frames of their own), or `[stack lost]`. One allocation per stack:
/// sized for the common case of no inlined frame.
fn named(names: &Names, frames: Option<&[NormFrame]>) -> Vec<Arc<Frame>> {
    let mut out = Vec::with_capacity(frames.map_or(1, <[_]>::len));
    name_into(&mut out, names, frames);
    out
}

/// `named`, added to `out`.
fn name_into(out: &mut Vec<Arc<Frame>>, names: &Names, frames: Option<&[NormFrame]>) {
    let Some(frames) = frames else {
        // One of its own per stack: lost stacks are told apart (merge).
        out.push(stack_lost_frame());
        return;
    };
    for f in frames {
        out.extend(names.get(f).iter().cloned());
    }
}

/// Addresses outside the maps read before the process exited have no
/// module: not a stack-depth problem. Or exec'ed: the maps read are its
/// new image's.
fn exited_early(state: &State, unread: &BTreeSet<u32>, stack: &Stack) -> bool {
    let folded_or_executed = state
        .processes()
        .get(stack.process)
        .is_some_and(|p| p.folded > 0 || p.executed);
    (unread.contains(&stack.pid) || folded_or_executed)
        && stack
            .frames
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f.module.is_none()))
}

fn saturating_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn add(total: &mut Counts, c: &Counts) {
    total.inuse_bytes += c.inuse_bytes;
    total.inuse_objects += c.inuse_objects;
    total.alloc_bytes += c.alloc_bytes;
    total.alloc_objects += c.alloc_objects;
    total.peak_inuse_bytes += c.peak_inuse_bytes;
    total.peak_inuse_objects += c.peak_inuse_objects;
}

/// What exited processes had not freed, summed per program and call stack
/// (processes of one program share their frame lists): bounded by the
/// distinct stacks, not by the number of processes.
fn not_freed_at_exit(collector: &Collector, names: &Names) -> NotFreedAtExit {
    type Key<'a> = (&'a str, Option<*const NormFrame>, bool);
    let state = &collector.state;
    let mut groups: HashMap<Key<'_>, (Unfreed, StackHandle)> = HashMap::new();
    for (h, unfreed) in state.heap().unfreed_at_exit() {
        let Some(stack) = state.stacks().table.get(h) else {
            continue;
        };
        let program =
            state
                .processes()
                .get(stack.process)
                .map_or("", |p| match p.program.as_str() {
                    "" => p.command.split_whitespace().next().unwrap_or(""),
                    program => program,
                });
        let frames = stack.frames.as_ref().map(|f| f.as_ptr());
        let group = groups
            .entry((program, frames, stack.truncated))
            .or_insert_with(|| (Unfreed::default(), h));
        group.0.bytes += unfreed.bytes;
        group.0.objects += unfreed.objects;
        // Each process's stacks are its own, and a folded group's stack
        // counts every process folded into it.
        group.0.processes += unfreed.processes;
    }
    let mut out = NotFreedAtExit {
        processes: state.heap().exited_with_unfreed,
        ..NotFreedAtExit::default()
    };
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_unstable_by(|a, b| {
        (b.1 .0.bytes, b.1 .0.objects)
            .cmp(&(a.1 .0.bytes, a.1 .0.objects))
            .then_with(|| a.0 .0.cmp(b.0 .0))
    });
    for ((program, _, truncated), (unfreed, h)) in groups {
        out.bytes += unfreed.bytes;
        out.objects += unfreed.objects;
        if out.stacks.len() >= MAX_EXIT_STACKS {
            out.stacks_left_out += 1;
            continue;
        }
        let frames = named(
            names,
            state
                .stacks()
                .table
                .get(h)
                .and_then(|s| s.frames.as_deref()),
        );
        out.stacks.push(ExitStack {
            program: program.to_string(),
            processes: unfreed.processes,
            bytes: unfreed.bytes,
            objects: unfreed.objects,
            truncated: super::roots::cut_short(&frames, truncated),
            frames: frames.into(),
        });
    }
    out
}

/// Frames compared by (function, offset), leaf first, then by depth.
/// Compared lazily: ties on the numbers are common (every stack of a
/// many-stack report may hold the same bytes) and must not allocate; a
/// frame shared by both stacks (one `Arc` per named frame) is equal
/// without comparing its name.
fn cmp_frames(a: &[Arc<Frame>], b: &[Arc<Frame>]) -> std::cmp::Ordering {
    for (x, y) in a.iter().zip(b) {
        if Arc::ptr_eq(x, y) {
            continue;
        }
        let order = (x.function.as_str(), x.offset).cmp(&(y.function.as_str(), y.offset));
        if order.is_ne() {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

fn stack_lost_frame() -> Arc<Frame> {
    Arc::new(Frame {
        function: "[stack lost]".into(),
        module: "[unknown]".into(),
        ..Frame::default()
    })
}
