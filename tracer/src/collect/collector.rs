//! Drains the ring buffer, turns raw events into heap-model updates, and
//! interns call stacks (read from the stack map or unwound from copied stack
//! bytes, and normalized while the process is alive).

use super::ProcessChange;
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use aya::maps::MapData;
use tracer_common::{
    Event, LiveKey, LiveValue, SampleHeader, EVENT_ALLOC, EVENT_ALLOC_FRAMES, EVENT_ALLOC_SAMPLE,
    EVENT_EXEC, EVENT_EXIT, EVENT_FORK, EVENT_FREE,
};

use crate::{
    collect::{
        processes::ProcessTable,
        reader::{read_pod, Reader},
        stacks::StackInterner,
    },
    model::{
        heap::{Heap, StackHandle},
        history::History,
    },
    probes::loader::EventMaps,
    stacks::{modules::Modules, unwind::Sample},
    trace_stats::TraceStats,
    tracee::liveness::{has_exited_since, start_time},
};

/// Most execs waiting for the session (see `State::execs`).
const MAX_PENDING_EXECS: usize = 1 << 16;
/// LIVE entries deleted per drain (about 1 µs each).
const PURGE_PER_DRAIN: usize = 4096;

/// Everything the events update; separate from the ring buffer so that a
/// ring-buffer item (which borrows the buffer) can be handled in place.
pub struct State {
    /// BPF's LIVE map: entries of exited processes are deleted from here.
    live_map: aya::maps::HashMap<MapData, LiveKey, LiveValue>,
    /// LIVE entries of exited processes not deleted yet (see `purge`).
    stale_live: Vec<LiveKey>,
    /// LIVE entries of exited processes deleted so far.
    pub purged_live: u64,
    pub heap: Heap,
    /// The heap's history (--interval, --serve): None without ticks.
    pub history: Option<History>,
    /// The interned stacks, and what turns events into them.
    pub stacks: StackInterner,
    pub modules: Modules,
    /// Mean sampling interval in bytes; 1 = every allocation.
    sample_rate: u64,
    /// Every process an allocation came from, with its command line as
    /// read when its first event arrived.
    pub processes: ProcessTable,
    /// The process whose exit ends the trace (--pid, -- CMD): what it had
    /// not freed stays in-use (the heap at the end is its heap at exit).
    /// Other processes' unfreed blocks go to "not freed at exit".
    trace_root: Option<u32>,
    /// Exited processes whose stacks are still their own, oldest first.
    /// Beyond `keep_exited`, the oldest is folded into its program's group,
    /// so that what the tracer keeps is bounded by programs and stacks, not
    /// by how many processes ran.
    exited: std::collections::VecDeque<crate::collect::processes::ProcessIndex>,
    pub keep_exited: usize,
    /// Events that could not be decoded (should never happen).
    pub malformed_events: u64,
    /// Events handled since the trace started, by any drain.
    events: u64,
    /// Processes that called exec, not handled by the session yet.
    execs: std::collections::VecDeque<u32>,
    /// Execs dropped from a full backlog (their new objects not inspected).
    execs_skipped: u64,
    /// Processes that forked, exec'ed or exited since the session last
    /// looked, in order.
    process_changes: Vec<ProcessChange>,
    /// Every process with state here, with its start time (/proc/PID/stat
    /// field 22) when first seen: a pid reused by a newer process differs.
    tracked: HashMap<u32, Option<u64>>,
    last_reap: Instant,
}

/// Turns the BPF programs' events into the heap model and interned stacks.
/// The session reads it through methods; its state is collect/'s own.
pub struct Collector {
    events: Reader,
    pub(super) state: State,
}

/// How a collector is set up, once, at construction.
pub struct CollectorOptions {
    /// Mean sampling interval in bytes; 1 = every allocation.
    pub sample_rate: u64,
    /// The process whose exit ends the trace (--pid, -- CMD).
    pub trace_root: Option<u32>,
    /// Exited processes whose stacks stay their own (--exited-processes).
    pub keep_exited: usize,
    /// --binary: the program, for processes gone before they were named.
    pub program_hint: Option<String>,
}

impl Collector {
    pub fn new(
        maps: EventMaps,
        modules: Modules,
        options: CollectorOptions,
    ) -> anyhow::Result<Self> {
        let CollectorOptions {
            sample_rate,
            trace_root,
            keep_exited,
            program_hint,
        } = options;
        let EventMaps {
            events,
            stacks: stack_map,
            live: live_map,
            unwind: _,
        } = maps;
        Ok(Collector {
            events: Reader::start(events)?,
            state: State {
                live_map,
                stale_live: Vec::new(),
                purged_live: 0,
                heap: Heap::default(),
                history: None,
                stacks: StackInterner::new(stack_map),
                modules,
                sample_rate,
                processes: ProcessTable::new(program_hint),
                trace_root,
                exited: std::collections::VecDeque::new(),
                keep_exited,
                malformed_events: 0,
                events: 0,
                execs: std::collections::VecDeque::new(),
                execs_skipped: 0,
                process_changes: Vec::new(),
                tracked: HashMap::new(),
                last_reap: Instant::now(),
            },
        })
    }

    /// Every process an allocation came from.
    pub fn processes(&self) -> &ProcessTable {
        &self.state.processes
    }

    /// The heap model, read-only (progress, stats, notes).
    pub fn heap(&self) -> &Heap {
        &self.state.heap
    }

    /// Records the heap's per-stack sums as a history point at `secs`.
    pub fn tick_history(&mut self, secs: f64) {
        self.state.tick_history(secs);
    }

    /// Reads `pid`'s memory maps now (a process the scope just found).
    pub fn refresh_maps(&mut self, pid: u32) {
        self.state.modules.refresh(pid);
    }

    /// BPF's LIVE map entries now, and those of exited processes deleted.
    pub fn live_entries(&self) -> (usize, u64) {
        (self.state.live_entries(), self.state.purged_live)
    }

    /// Processes with state here.
    pub fn tracked_processes(&self) -> usize {
        self.state.tracked_processes()
    }

    /// `--unwind tables`: the kernel walker's counters and the tables'.
    pub fn kernel_unwind(
        &self,
        counters: &aya::maps::PerCpuArray<MapData, u64>,
    ) -> Option<super::unwind_notes::KernelUnwind> {
        let tables = self.state.modules.kernel.as_ref()?;
        Some(super::unwind_notes::KernelUnwind::read(
            counters,
            tables.stats,
        ))
    }

    /// The unwinders' counters (--verbose).
    pub fn unwind_stats(&self) -> crate::stacks::unwind::UnwindStats {
        self.state.stacks.unwinders.stats
    }

    /// What happened to processes since the last call: forks, execs and
    /// exits, in order (for the scope's bookkeeping).
    pub fn take_process_changes(&mut self) -> Vec<ProcessChange> {
        std::mem::take(&mut self.state.process_changes)
    }

    /// The oldest exec whose new image the session has not inspected yet.
    pub fn next_exec(&mut self) -> Option<u32> {
        self.state.execs.pop_front()
    }

    /// Execs dropped from a full backlog or still waiting.
    pub fn execs_not_inspected(&self) -> u64 {
        self.state.execs_skipped + self.state.execs.len() as u64
    }

    /// The numbers of now, for the progress line, --verbose and /metrics
    /// (sums the stacks' in-use bytes: about once a second at most).
    pub fn stats(&self) -> TraceStats {
        let state = &self.state;
        TraceStats {
            events: state.events,
            live_bytes: state.heap.inuse_bytes(),
            live_blocks: state.heap.live_blocks(),
            tracked_processes: state.tracked_processes(),
        }
    }

    /// Entries in BPF's LIVE map now: one syscall per entry, so only for
    /// --verbose's stats line.
    pub fn live_map_entries(&self) -> usize {
        self.state.live_entries()
    }

    /// Readable when the reader thread has queued events.
    pub fn events_fd(&self) -> std::os::fd::RawFd {
        self.events.ready_fd()
    }

    /// Process `pid` is held at its exit: its maps are read now, the last
    /// time they can be, and its events are handled with them.
    pub fn drain_exiting(&mut self, pid: u32) {
        if self.state.modules.refresh_now(pid) {
            self.state.stacks.unwinders.invalidate(pid);
        }
        self.drain_all();
    }

    /// Handles every event submitted until now (at the end of a trace).
    pub fn drain_all(&mut self) -> usize {
        let Collector { events, state } = self;
        let n = state.handle_batches(events.take_all());
        state.purge();
        n
    }

    /// Handles the events the reader has queued. Returns how many. About
    /// once a second, also drops what is kept for processes that exited.
    pub fn drain(&mut self) -> usize {
        let n = self.drain_events();
        if self.state.last_reap.elapsed() >= REAP_INTERVAL {
            self.reap_exited();
        }
        n
    }

    fn drain_events(&mut self) -> usize {
        let Collector { events, state } = self;
        let n = state.handle_batches(events.take());
        state.purge();
        n
    }

    /// Drops the maps, unwinder and stack-lookup tables of processes that
    /// exited. Their events were all submitted before they exited, so
    /// before this looked: the drain here handles the last of them first.
    /// What their interned stacks need (the objects) stays.
    pub fn reap_exited(&mut self) {
        self.state.last_reap = Instant::now();
        // The reader's batches (a burst of DWARF samples can queue hundreds
        // of MiB) are freed once handled, but glibc keeps freed heap pages
        // mapped: give them back, so the RSS follows what is really held.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
        // Processes the scope read maps for that sent no event yet.
        let state = &mut self.state;
        for pid in state.modules.pids() {
            state.tracked.entry(pid).or_insert_with(|| start_time(pid));
        }
        let gone: Vec<u32> = state
            .tracked
            .iter()
            .filter(|(&pid, &start)| has_exited_since(pid, start))
            .map(|(&pid, _)| pid)
            .collect();
        if !gone.is_empty() {
            self.drain_all();
        }
        for pid in gone {
            // Normally its EXIT event did this already; not when the event
            // was lost (ring buffer full).
            self.state.process_gone(pid);
        }
        self.state.stacks.unwinders.evict_unused();
    }
}

/// How often `drain` looks for processes that exited.
const REAP_INTERVAL: Duration = Duration::from_secs(1);

impl State {
    fn handle_batches(&mut self, batches: Vec<Vec<u8>>) -> usize {
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
        let started = *self
            .tracked
            .entry(ev.pid)
            .or_insert_with(|| start_time(ev.pid));
        match ev.kind {
            EVENT_ALLOC => {
                let process = self.processes.instance(ev.pid, started);
                let stack =
                    self.stacks
                        .intern_stack_id(&mut self.modules, ev.pid, process, ev.stack_id);
                self.record(&ev, stack);
            }
            EVENT_ALLOC_SAMPLE => {
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
                let handle = self
                    .stacks
                    .intern_sample(&mut self.modules, ev.pid, process, &sample);
                self.record(&ev, handle);
            }
            EVENT_ALLOC_FRAMES => {
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
            EVENT_FREE => self.heap.free(ev.pid, ev.addr),
            EVENT_EXEC => {
                self.heap.drop_process(ev.pid);
                self.stacks.forget_process(ev.pid);
                self.modules.forget(ev.pid);
                // Now, not at its first allocation: a short-lived process
                // may be gone by then. The EXEC event wakes us at once; the
                // program and its loader are mapped, the libraries follow
                // (read again when an address falls outside these).
                self.modules.refresh_now(ev.pid);
                let comm = tracer_common::exec_comm(&ev);
                let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
                let comm = String::from_utf8_lossy(&comm[..len]).into_owned();
                self.processes.executed(ev.pid, &comm);
                // Bounded: a backlog beyond this (a host starting programs
                // faster than their objects can be read) loses its oldest,
                // counted and reported.
                if self.execs.len() >= MAX_PENDING_EXECS {
                    self.execs.pop_front();
                    self.execs_skipped += 1;
                }
                self.execs.push_back(ev.pid);
                self.process_changes
                    .push(ProcessChange::Executed { pid: ev.pid, comm });
            }
            EVENT_FORK => {
                self.forked(ev.pid, ev.tid);
                self.process_changes.push(ProcessChange::Forked {
                    child: ev.pid,
                    parent: ev.tid,
                });
            }
            EVENT_EXIT => {
                // Its events all came before this one.
                self.process_gone(ev.pid);
                self.process_changes
                    .push(ProcessChange::Exited { pid: ev.pid });
            }
            _ => self.malformed_events += 1,
        }
    }

    /// A history tick at `secs` since the trace started: the heap's
    /// per-stack sums now (no symbolization).
    pub fn tick_history(&mut self, secs: f64) {
        let history = self.history.get_or_insert_with(History::default);
        history.tick(secs, self.heap.stacks());
    }

    /// Entries in BPF's LIVE map now (reads every key: for --verbose).
    pub fn live_entries(&self) -> usize {
        self.live_map.keys().filter(Result::is_ok).count()
    }

    /// Processes with per-process state here (dropped when they exit).
    pub fn tracked_processes(&self) -> usize {
        self.tracked.len()
    }

    /// Deletes LIVE entries of exited processes, a bounded number per
    /// drain (one syscall each) so that the reader is never held up long;
    /// the kernel map then holds only blocks of processes that still run.
    fn purge(&mut self) {
        let from = self.stale_live.len().saturating_sub(PURGE_PER_DRAIN);
        for key in self.stale_live.drain(from..) {
            // Already gone when a late FREE raced the exit: nothing to do.
            if self.live_map.remove(&key).is_ok() {
                self.purged_live += 1;
            }
        }
    }

    /// Until it execs, a forked child has its parent's mappings: a child
    /// that exits before its own maps are read still gets named frames. A
    /// pid seen before is a new process now.
    fn forked(&mut self, child: u32, parent: u32) {
        self.stacks.forget_process(child);
        self.modules.forget(child);
        let maps = self.modules.maps(parent).to_vec();
        if !maps.is_empty() {
            self.modules.set_maps(child, maps);
        }
    }

    /// Process `pid` exited and its events are handled: its blocks leave
    /// the heap model and the kernel's LIVE map, and what is kept to
    /// resolve its stacks is dropped.
    fn process_gone(&mut self, pid: u32) {
        let root = self.trace_root == Some(pid);
        let addrs = self.heap.exited(pid, root);
        self.stale_live
            .extend(addrs.into_iter().map(|addr| LiveKey { pid, _pad: 0, addr }));
        if let Some(i) = self.processes.current(pid).filter(|_| !root) {
            self.exited.push_back(i);
        }
        self.processes.exited(pid);
        self.drop_process(pid);
        while self.exited.len() > self.keep_exited {
            let Some(oldest) = self.exited.pop_front() else {
                break;
            };
            if let Some(group) = self.processes.fold(oldest) {
                let (stacks, heap, history) =
                    (&mut self.stacks.table, &mut self.heap, &mut self.history);
                stacks.fold(oldest, group, |from, into| {
                    heap.merge(from, into);
                    if let Some(history) = history.as_mut() {
                        history.merge(from, into);
                    }
                });
            }
        }
    }

    fn drop_process(&mut self, pid: u32) {
        self.tracked.remove(&pid);
        self.stacks.drop_process(pid);
        self.modules.drop_process(pid);
    }

    fn record(&mut self, ev: &Event, stack: StackHandle) {
        let weight = crate::model::sampling::weight(ev.size, self.sample_rate);
        self.heap
            .alloc(ev.pid, ev.addr, ev.size, weight, stack, ev.timestamp_ns);
    }
}
