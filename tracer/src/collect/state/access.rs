//! What the collector and the notes read of the state, and the few
//! changes the collector makes to it: the state's fields are its own.

use std::time::{Duration, Instant};

use super::State;
use crate::{
    collect::{oom::OomKills, processes::ProcessTable, stacks::StackInterner, Exec, ProcessChange},
    model::{heap::Heap, history::History, temporary::Temporaries},
    stacks::modules::Modules,
    tracee::liveness::{has_exited_since, start_time},
};

impl State {
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    pub(in crate::collect) fn heap_mut(&mut self) -> &mut Heap {
        &mut self.heap
    }

    /// The heap's history: None without ticks.
    pub fn history(&self) -> Option<&History> {
        self.history.as_ref()
    }

    pub fn modules(&self) -> &Modules {
        &self.modules
    }

    pub(in crate::collect) fn modules_mut(&mut self) -> &mut Modules {
        &mut self.modules
    }

    /// The interned stacks.
    pub fn stacks(&self) -> &StackInterner {
        &self.stacks
    }

    /// The interned stacks and the modules they are interned with.
    pub(in crate::collect) fn interning_mut(&mut self) -> (&mut StackInterner, &mut Modules) {
        (&mut self.stacks, &mut self.modules)
    }

    /// Every process an allocation came from.
    pub fn processes(&self) -> &ProcessTable {
        &self.processes
    }

    /// The processes the OOM killer chose.
    pub fn oom(&self) -> &OomKills {
        &self.oom
    }

    /// Temporary allocations per stack (exact mode only).
    pub fn temporaries(&self) -> Option<&Temporaries> {
        self.temporaries.as_ref()
    }

    /// When the trace started, on the events' clock.
    pub fn started_ns(&self) -> u64 {
        self.started_ns
    }

    /// Events handled since the trace started.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// FREE events read (--verbose).
    pub fn free_events(&self) -> u64 {
        self.free_events
    }

    /// Exact mode: frees of blocks the trace never saw allocated.
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// When sampling, FREE events of blocks the model does not hold.
    pub fn unmatched_frees(&self) -> u64 {
        self.unmatched_frees
    }

    /// Events that could not be decoded.
    pub fn malformed_events(&self) -> u64 {
        self.malformed_events
    }

    /// Exact mode: allocations beyond --max-live, not tracked.
    pub fn untracked_allocs(&self) -> u64 {
        self.untracked_allocs
    }

    /// LIVE entries of exited processes deleted so far.
    pub fn purged_live(&self) -> u64 {
        self.purged_live
    }

    /// Execs dropped from a full backlog or still waiting.
    pub fn execs_not_inspected(&self) -> u64 {
        self.execs_skipped + self.execs.len() as u64
    }

    /// What happened to processes since the last call, in order.
    pub(in crate::collect) fn take_process_changes(&mut self) -> Vec<ProcessChange> {
        std::mem::take(&mut self.process_changes)
    }

    /// The oldest exec whose new image the session has not inspected yet.
    pub(in crate::collect) fn next_exec(&mut self) -> Option<Exec> {
        self.execs.pop_front()
    }

    /// Whether `every` has passed since processes were last reaped.
    pub(in crate::collect) fn reap_due(&self, every: Duration) -> bool {
        self.last_reap.elapsed() >= every
    }

    /// The processes with state here that have exited, now (also those
    /// the scope read maps for that sent no event yet).
    pub(in crate::collect) fn exited_processes(&mut self) -> Vec<u32> {
        self.last_reap = Instant::now();
        for pid in self.modules.pids() {
            self.tracked.entry(pid).or_insert_with(|| start_time(pid));
        }
        self.tracked
            .iter()
            .filter(|(&pid, &start)| has_exited_since(pid, start))
            .map(|(&pid, _)| pid)
            .collect()
    }
}
