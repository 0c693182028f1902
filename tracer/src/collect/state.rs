//! What the events update: the heap model and its history, the interned
//! stacks, the processes seen and what is kept of those that exited. Each
//! raw event from the ring buffer is decoded and applied here.

use crate::hashing::FastMap;
use std::time::Instant;

use aya::maps::MapData;
use tracer_common::{Event, EventKind, LiveKey, LiveValue, Role, SampleHeader, EVENT_UNLESS_LIVE};

use crate::{
    collect::{
        oom::OomKills, peaks::EndedPeaks, processes::ProcessTable, reader::read_pod,
        stacks::StackInterner, ProcessChange,
    },
    model::{
        heap::{Heap, StackHandle},
        history::History,
        peak_trigger::PeakTrigger,
        temporary::Temporaries,
    },
    probes::map_count::MapCounter,
    profile::Sampling,
    stacks::{modules::Modules, unwind::Sample},
    tracee::liveness::{start_time, start_time_of_boot_ns},
};

mod access;
mod lifecycle;

/// Most execs waiting for the session (see `State::execs`).
const MAX_PENDING_EXECS: usize = 1 << 16;
/// LIVE entries deleted per drain (about 1 µs each).
const PURGE_PER_DRAIN: usize = 4096;

/// Everything the events update; separate from the ring buffer so that a
/// ring-buffer item (which borrows the buffer) can be handled in place.
/// The collector drains into it and reads it; nothing here knows the
/// collector.
pub struct State {
    /// BPF's LIVE map: entries of exited processes are deleted from here.
    live_map: aya::maps::HashMap<MapData, LiveKey, LiveValue>,
    /// Counts `live_map`'s entries in batches.
    live_count: MapCounter,
    /// LIVE entries of exited processes not deleted yet (see `purge`).
    stale_live: Vec<LiveKey>,
    /// LIVE entries of exited processes deleted so far.
    purged_live: u64,
    heap: Heap,
    /// The heap's history (--interval, --serve): None without ticks.
    history: Option<History>,
    /// The interned stacks, and what turns events into them.
    stacks: StackInterner,
    modules: Modules,
    sampling: Sampling,
    /// --max-live. In exact mode BPF sends every free and keeps no LIVE
    /// entry of reported blocks: this bounds the heap model instead (set
    /// by the collector; unbounded until then).
    max_live: usize,
    /// Exact mode: allocations not tracked because the model held
    /// `max_live` blocks (added to the `live_map_full` loss counter).
    untracked_allocs: u64,
    /// Exact mode: free() of blocks the trace never saw allocated (added
    /// to the `unknown_frees` counter, which BPF counts when sampling).
    unknown_frees: u64,
    /// FREE events read (--verbose).
    free_events: u64,
    /// When sampling, FREE events for a block the model does not hold: BPF
    /// sends FREE only for blocks it recorded, so this stays 0 unless an
    /// ALLOC was lost.
    unmatched_frees: u64,
    /// Every process an allocation came from, with its command line as
    /// read when its first event arrived.
    processes: ProcessTable,
    /// The process whose exit ends the trace (--pid, -- CMD): what it had
    /// not freed stays in-use (the heap at the end is its heap at exit).
    /// Other processes' unfreed blocks go to "not freed at exit".
    trace_root: Option<u32>,
    /// Exited processes whose stacks are still their own, oldest first.
    /// Beyond `keep_exited`, the oldest is folded into its program's group,
    /// so that what the tracer keeps is bounded by programs and stacks, not
    /// by how many processes ran.
    exited: std::collections::VecDeque<crate::collect::processes::ProcessIndex>,
    keep_exited: usize,
    /// The peaks of processes that exited (running ones are the heap's).
    ended_peaks: EndedPeaks,
    /// When the trace started, on the events' clock (for peaks' times).
    started_ns: u64,
    /// Events that could not be decoded (should never happen).
    malformed_events: u64,
    /// Events handled since the trace started, by any drain.
    events: u64,
    /// Processes that called exec, not handled by the session yet.
    execs: std::collections::VecDeque<crate::collect::Exec>,
    /// Execs dropped from a full backlog (their new objects not inspected).
    execs_skipped: u64,
    /// Processes that forked, exec'ed or exited since the session last
    /// looked, in order.
    process_changes: Vec<ProcessChange>,
    /// Read a process's maps at its exec event (and, with `--unwind
    /// tables`, describe them to the kernel). False under `--binary`, where
    /// every exec on the host is reported and the session reads the maps
    /// only of those that run the binary (`Collector::refresh_maps`):
    /// building tables for every program the host starts would keep the
    /// loop from draining events (seconds for a compiler's libraries).
    maps_at_exec: bool,
    /// Every process with state here, with its start time (/proc/PID/stat
    /// field 22) when first seen: a pid reused by a newer process differs.
    tracked: FastMap<u32, Option<u64>>,
    last_reap: Instant,
    /// Processes the OOM killer chose.
    oom: OomKills,
    /// Temporary allocations per stack: exact mode only (None when
    /// sampling, see model/temporary.rs).
    temporaries: Option<Temporaries>,
}

/// What a trace's state is set up with, once.
pub(super) struct StateSetup {
    pub sampling: Sampling,
    /// The process whose exit ends the trace (--pid, -- CMD).
    pub trace_root: Option<u32>,
    /// Exited processes whose stacks stay their own (--exited-processes).
    pub keep_exited: usize,
    /// --max-live (exact mode's bound on the heap model).
    pub max_live: usize,
    /// Whether a process's maps are read at its exec event (see
    /// `State::maps_at_exec`).
    pub maps_at_exec: bool,
    /// --snapshot-on-peak's trigger.
    pub peak_trigger: Option<PeakTrigger>,
}

impl State {
    pub(super) fn new(
        stacks: StackInterner,
        // LIVE, and what counts its entries.
        (live_map, live_count): (aya::maps::HashMap<MapData, LiveKey, LiveValue>, MapCounter),
        modules: Modules,
        processes: ProcessTable,
        setup: StateSetup,
    ) -> State {
        let StateSetup {
            sampling,
            trace_root,
            keep_exited,
            max_live,
            maps_at_exec,
            peak_trigger,
        } = setup;
        let heap = Heap::new(peak_trigger);
        State {
            live_map,
            live_count,
            stale_live: Vec::new(),
            purged_live: 0,
            heap,
            history: None,
            stacks,
            modules,
            sampling,
            max_live,
            untracked_allocs: 0,
            unknown_frees: 0,
            free_events: 0,
            unmatched_frees: 0,
            processes,
            trace_root,
            exited: std::collections::VecDeque::new(),
            keep_exited,
            ended_peaks: EndedPeaks::default(),
            started_ns: monotonic_ns(),
            malformed_events: 0,
            events: 0,
            execs: std::collections::VecDeque::new(),
            execs_skipped: 0,
            process_changes: Vec::new(),
            maps_at_exec,
            tracked: FastMap::default(),
            last_reap: Instant::now(),
            oom: OomKills::default(),
            temporaries: sampling.is_exact().then(Temporaries::default),
        }
    }

    pub(super) fn handle_batches(&mut self, batches: Vec<Vec<u8>>) -> usize {
        let mut n = 0;
        for batch in batches {
            for item in crate::collect::reader::events(&batch) {
                self.handle(item);
                n += 1;
            }
        }
        self.events += n as u64;
        n
    }

    fn handle(&mut self, bytes: &[u8]) {
        let Some(ev) = read_pod::<Event>(bytes) else {
            self.malformed_events += 1;
            return;
        };
        let Ok(kind) = ev.kind() else {
            self.malformed_events += 1;
            return;
        };
        // An exec says when its process started: its pid may be another
        // process's by the time /proc is read.
        let started = match start_time_of_boot_ns(ev.timestamp_ns) {
            Some(start) if kind == EventKind::Exec => {
                self.tracked.insert(ev.pid, Some(start));
                Some(start)
            }
            _ => *self
                .tracked
                .entry(ev.pid)
                .or_insert_with(|| start_time(ev.pid)),
        };
        if kind.is_alloc() && !self.admit(&ev) {
            return;
        }
        match kind {
            EventKind::Alloc => {
                let process = self.processes.instance(ev.pid, started);
                let stack =
                    self.stacks
                        .intern_stack_id(&mut self.modules, ev.pid, process, ev.stack_id);
                self.record(&ev, stack);
            }
            EventKind::AllocSample => self.alloc_sample(&ev, bytes, started),
            EventKind::AllocFrames => {
                let process = self.processes.instance(ev.pid, started);
                let Some(handle) =
                    self.stacks
                        .intern_frames_event(&mut self.modules, bytes, process)
                else {
                    self.malformed_events += 1;
                    return;
                };
                self.record(&ev, handle);
            }
            EventKind::Free => {
                self.free_events += 1;
                if !self.heap.free(ev.pid, ev.addr) {
                    self.unknown_free(&ev);
                }
                if let Some(t) = &mut self.temporaries {
                    t.free(ev.pid, ev.tid, ev.addr, ev.role == Role::Free as u32);
                }
            }
            EventKind::OomKill => {
                // A victim with no allocation traced has nothing to keep.
                if let Some(i) = self.processes.current(ev.pid) {
                    self.oom.mark(ev.pid, i, ev.timestamp_ns);
                }
            }
            EventKind::Exec => self.executed(&ev),
            EventKind::Fork => {
                self.forked(ev.pid, ev.tid);
                self.process_changes.push(ProcessChange::Forked {
                    child: ev.pid,
                    parent: ev.tid,
                });
            }
            EventKind::Exit => {
                // Its events all came before this one.
                self.process_gone(ev.pid);
                self.process_changes
                    .push(ProcessChange::Exited { pid: ev.pid });
            }
        }
    }

    /// An allocation with a copy of its stack for user space to unwind.
    fn alloc_sample(&mut self, ev: &Event, bytes: &[u8], started: Option<u64>) {
        let Some(h) = read_pod::<SampleHeader>(bytes) else {
            self.malformed_events += 1;
            return;
        };
        let start = std::mem::size_of::<SampleHeader>();
        let stack = bytes
            .get(start..start + h.stack_len as usize)
            .unwrap_or_default();
        let sample = Sample {
            ip: h.ip,
            sp: h.sp,
            bp: h.bp,
            stack,
        };
        let process = self.processes.instance(ev.pid, started);
        let handle =
            self.stacks
                .intern_sample(&mut self.modules, ev.pid, process, &sample, h.maps_gen);
        self.record(ev, handle);
    }

    /// Whether an exact-mode ALLOC enters the model: not when a call
    /// inside the one that returned it recorded the block already
    /// (`EVENT_UNLESS_LIVE`), nor when the model holds --max-live blocks
    /// (counted). When sampling, BPF's LIVE map decided both.
    fn admit(&mut self, ev: &Event) -> bool {
        if !self.sampling.is_exact() {
            return true;
        }
        let unless_live = ev.flags & EVENT_UNLESS_LIVE != 0;
        let full = self.heap.live_blocks() >= self.max_live;
        if !unless_live && !full {
            return true;
        }
        let live = self.heap.is_live(ev.pid, ev.addr);
        if unless_live && live {
            return false;
        }
        if full && !live {
            self.untracked_allocs += 1;
            return false;
        }
        true
    }

    /// A FREE of a block the model does not hold. In exact mode BPF sends
    /// every free(): one of a block from before the trace, of the
    /// allocator's own memory or of an untracked block is counted as BPF
    /// counts it when sampling (free() only, not realloc's). When sampling
    /// it should not happen.
    fn unknown_free(&mut self, ev: &Event) {
        if !self.sampling.is_exact() {
            self.unmatched_frees += 1;
        } else if ev.role == Role::Free as u32 {
            self.unknown_frees += 1;
        }
    }

    /// A history tick at `secs` since the trace started: the heap's
    /// per-stack sums now (no symbolization).
    /// `unknown_free_bytes`: what frees of blocks the trace never saw
    /// allocated handed back so far.
    pub fn tick_history(&mut self, secs: f64, unknown_free_bytes: u64, resident: Option<u64>) {
        let history = self.history.get_or_insert_with(History::default);
        history.set_unknown_free_bytes(unknown_free_bytes);
        history.set_resident_bytes(resident);
        history.tick(secs, self.heap.stacks());
    }

    /// Entries in BPF's LIVE map now (reads every key: for --verbose).
    pub fn live_entries(&self) -> usize {
        // A kernel without batch lookups (< 5.6): one key at a time.
        self.live_count
            .count()
            .unwrap_or_else(|_| self.live_map.keys().filter(Result::is_ok).count())
    }

    /// Processes with per-process state here (dropped when they exit).
    pub fn tracked_processes(&self) -> usize {
        self.tracked.len()
    }

    /// Deletes LIVE entries of exited processes, a bounded number per
    /// drain (one syscall each) so that the reader is never held up long;
    /// the kernel map then holds only blocks of processes that still run.
    pub(super) fn purge(&mut self) {
        let from = self.stale_live.len().saturating_sub(PURGE_PER_DRAIN);
        for key in self.stale_live.drain(from..) {
            // Already gone when a late FREE raced the exit: nothing to do.
            if self.live_map.remove(&key).is_ok() {
                self.purged_live += 1;
            }
        }
    }

    fn record(&mut self, ev: &Event, stack: StackHandle) {
        let weight = crate::model::sampling::weight(ev.size, self.sampling.rate());
        self.heap
            .alloc(ev.pid, ev.addr, ev.size, weight, stack, ev.timestamp_ns);
        if let Some(t) = &mut self.temporaries {
            t.alloc(ev.pid, ev.tid, ev.addr, ev.size, stack);
        }
    }
}

/// Now on the clock of the events' `timestamp_ns` (bpf_ktime_get_ns is
/// CLOCK_MONOTONIC), for --min-age, the peaks' times and the windows of
/// served delta profiles.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given, which
    // lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}
