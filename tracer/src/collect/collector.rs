//! Drains the ring buffer into the events' `State` (the heap model, the
//! interned stacks), and about once a second drops what is kept for
//! processes that exited. The session reads it through methods.

use std::time::Duration;

use aya::maps::MapData;
use tracer_common::counter;

use crate::{
    collect::{
        processes::ProcessTable,
        reader::Reader,
        stacks::StackInterner,
        state::{State, StateSetup},
        ProcessChange,
    },
    model::{heap::Heap, peak_trigger::PeakTrigger},
    probes::loader::EventMaps,
    profile::Losses,
    stacks::modules::Modules,
    trace_stats::TraceStats,
};

/// Turns the BPF programs' events into the heap model and interned stacks.
/// The session reads it through methods; its state is collect/'s own.
pub struct Collector {
    events: Reader,
    pub(super) state: State,
}

/// How a collector is set up, once, at construction.
pub struct CollectorOptions {
    pub sampling: crate::profile::Sampling,
    /// --max-live: in exact mode, the most blocks the heap model tracks.
    pub max_live: u32,
    /// The process whose exit ends the trace (--pid, -- CMD).
    pub trace_root: Option<u32>,
    /// Exited processes whose stacks stay their own (--exited-processes).
    pub keep_exited: usize,
    /// --binary: the program, for processes gone before they were named.
    pub program_hint: Option<String>,
    /// --snapshot-on-peak's fraction.
    pub snapshot_on_peak: Option<f64>,
}

impl Collector {
    /// For a tracer about to exit: stops the ring buffer's reader and
    /// leaves the heap, stacks and maps to the process's exit instead of
    /// freeing them one by one.
    pub fn leak_state(self) {
        let Collector { events, state } = self;
        drop(events);
        std::mem::forget(state);
    }

    pub fn new(
        maps: EventMaps,
        modules: Modules,
        options: CollectorOptions,
    ) -> anyhow::Result<Self> {
        let CollectorOptions {
            sampling,
            max_live,
            trace_root,
            keep_exited,
            program_hint,
            snapshot_on_peak,
        } = options;
        let EventMaps {
            events,
            stacks: stack_map,
            live: live_map,
            live_count,
            unwind: _,
            code_gens: _,
        } = maps;
        let setup = StateSetup {
            sampling,
            trace_root,
            keep_exited,
            max_live: max_live as usize,
            maps_at_exec: program_hint.is_none(),
            peak_trigger: snapshot_on_peak.map(PeakTrigger::new),
        };
        let collector = Collector {
            events: Reader::start(events)?,
            state: State::new(
                StackInterner::new(stack_map),
                (live_map, live_count),
                modules,
                ProcessTable::new(program_hint),
                setup,
            ),
        };
        Ok(collector)
    }

    /// --snapshot-on-peak: the trace's heap grew past its threshold since
    /// the last `peak_snapshot_taken`.
    pub fn peak_grown(&self) -> bool {
        self.state.heap().peak_trigger.is_some_and(|t| t.grown())
    }

    /// A snapshot was written for --snapshot-on-peak: the threshold counts
    /// from the heap now.
    pub fn peak_snapshot_taken(&mut self) {
        if let Some(t) = &mut self.state.heap_mut().peak_trigger {
            t.taken();
        }
    }

    /// Every process an allocation came from.
    pub fn processes(&self) -> &ProcessTable {
        self.state.processes()
    }

    /// The loss counters BPF counted (`kernel`), with what user space
    /// counts in their place in exact mode: allocations beyond --max-live
    /// and frees of blocks never seen allocated.
    pub fn losses(&self, kernel: Losses) -> Losses {
        let mut losses = kernel;
        losses.add(counter::LIVE_MAP_FULL, self.state.untracked_allocs());
        losses.add(counter::UNKNOWN_FREE, self.state.unknown_frees());
        losses
    }

    /// The heap model, read-only (progress, stats, notes).
    pub fn heap(&self) -> &Heap {
        self.state.heap()
    }

    /// Records the heap's per-stack sums as a history point at `secs`,
    /// with what frees of blocks never seen allocated handed back so far
    /// and the kernel's resident bytes of what is traced.
    pub fn tick_history(&mut self, secs: f64, unknown_free_bytes: u64, resident: Option<u64>) {
        self.state.tick_history(secs, unknown_free_bytes, resident);
    }

    /// `--unwind tables`, a started command held at its exec stop: its
    /// events so far are handled (the EXEC event drops the old image's
    /// mappings and reads the new ones: program and loader), the maps are
    /// read again in case that event was not there, and the tables of the
    /// libraries it will map (`libraries`) are built now, so that its first
    /// allocations are walked in the kernel. Returns whether the command
    /// should stop again at its entry point (`describe_at_entry`).
    pub fn describe_at_exec<'p>(
        &mut self,
        pid: u32,
        libraries: impl Iterator<Item = &'p std::path::Path>,
    ) -> bool {
        if self.state.modules_mut().kernel().tables().is_none() {
            return false;
        }
        self.drain_all();
        self.state.modules_mut().refresh_now(pid);
        for path in libraries {
            self.state.modules_mut().prepare_table(path);
        }
        true
    }

    /// `--unwind tables`, a started command held at its entry point: the
    /// loader has mapped its libraries (their tables were built at the
    /// exec stop); they are described before `main` runs. Libraries opened
    /// later are described when their addresses first come back unknown
    /// (the maps are read again).
    pub fn describe_at_entry(&mut self, pid: u32) {
        self.state.modules_mut().refresh_now(pid);
    }

    /// Reads `pid`'s memory maps now (a process the scope just found).
    pub fn refresh_maps(&mut self, pid: u32) {
        self.state.modules_mut().refresh(pid);
    }

    /// BPF's LIVE map entries now, and those of exited processes deleted.
    /// FREE events read from the ring buffer, and of them frees of blocks
    /// the trace had no record of.
    pub fn free_events(&self) -> (u64, u64) {
        (self.state.free_events(), self.state.unknown_frees())
    }

    pub fn live_entries(&self) -> (usize, u64) {
        (self.state.live_entries(), self.state.purged_live())
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
        let tables = self.state.modules().kernel().tables()?;
        Some(super::unwind_notes::KernelUnwind {
            resumed_cut: self.state.stacks().unwinders.stats.resumed_cut,
            ..super::unwind_notes::KernelUnwind::read(counters, tables.stats)
        })
    }

    /// `--unwind tables`: the file with the most rows among those whose
    /// table did not fit (its path: hostile), and its rows.
    pub fn largest_unfit_table(&self) -> Option<(&str, u32)> {
        self.state.modules().kernel().largest_unfit_table()
    }

    /// Stacks with frames left unnamed because their code was replaced.
    pub fn code_stats(&self) -> crate::stacks::modules::CodeStats {
        self.state.modules().code_stats()
    }

    /// Objects named so far whose debug link was refused, and one of them.
    pub fn refused_debug_links(&self) -> (u64, Option<String>) {
        self.state.modules().objects().refused_debug_links()
    }

    /// `--unwind tables`: the rows and trie entries in use now.
    pub fn tables_in_use(&self) -> Option<crate::stacks::kernel_tables::TablesInUse> {
        self.state.modules().kernel().in_use()
    }

    /// JIT names: files read and refused, entries dropped at the caps, and
    /// frames left unnamed at the interning cap.
    pub fn jit_stats(&self) -> (crate::stacks::jit::JitStats, u64) {
        self.state.modules().jit_frames().stats()
    }

    /// The unwinders' counters (--verbose).
    pub fn unwind_stats(&self) -> crate::stacks::unwind::UnwindStats {
        self.state.stacks().unwinders.stats
    }

    /// What happened to processes since the last call: forks, execs and
    /// exits, in order (for the scope's bookkeeping).
    pub fn take_process_changes(&mut self) -> Vec<ProcessChange> {
        self.state.take_process_changes()
    }

    /// The oldest exec whose new image the session has not inspected yet.
    pub fn next_exec(&mut self) -> Option<crate::collect::Exec> {
        self.state.next_exec()
    }

    /// Execs dropped from a full backlog or still waiting.
    pub fn execs_not_inspected(&self) -> u64 {
        self.state.execs_not_inspected()
    }

    /// The numbers of now, for the progress line, --verbose and /metrics
    /// (sums the stacks' in-use bytes: about once a second at most).
    pub fn stats(&self) -> TraceStats {
        let state = &self.state;
        TraceStats {
            events: state.events(),
            live_bytes: state.heap().inuse_bytes(),
            live_blocks: state.heap().live_blocks(),
            tracked_processes: state.tracked_processes(),
        }
    }

    /// Entries in BPF's LIVE map now: a syscall per 4096 entries, only for
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
        if self.state.modules_mut().refresh_now(pid) {
            self.state.interning_mut().0.unwinders.invalidate(pid);
        }
        self.drain_all();
        // Its JIT flushed its perf map on the way out: the last names.
        let (stacks, modules) = self.state.interning_mut();
        modules.read_jit_now(pid);
        stacks.table.name_pending(modules, Some(pid));
    }

    /// Handles every event submitted until now (at the end of a trace).
    pub fn drain_all(&mut self) -> usize {
        let Collector { events, state } = self;
        let n = state.handle_batches(events.take_all());
        state.purge();
        let (stacks, modules) = state.interning_mut();
        stacks.table.name_pending(modules, None);
        n
    }

    /// Handles the events the reader has queued. Returns how many. About
    /// once a second, also drops what is kept for processes that exited.
    pub fn drain(&mut self) -> usize {
        let n = self.drain_events();
        if self.state.reap_due(REAP_INTERVAL) {
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
        let (stacks, modules) = self.state.interning_mut();
        stacks.table.name_pending(modules, None);
        // The reader's batches (a burst of DWARF samples can queue hundreds
        // of MiB) are freed once handled, but glibc keeps freed heap pages
        // mapped: give them back, so the RSS follows what is really held.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
        let gone = self.state.exited_processes();
        if !gone.is_empty() {
            self.drain_all();
        }
        for pid in gone {
            // Normally its EXIT event did this already; not when the event
            // was lost (ring buffer full).
            self.state.process_gone(pid);
        }
        self.state.interning_mut().0.unwinders.evict_unused();
        self.state
            .modules_mut()
            .tick_tables(std::time::Instant::now());
    }
}

/// How often `drain` looks for processes that exited.
const REAP_INTERVAL: Duration = Duration::from_secs(1);
