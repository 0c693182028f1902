//! A traced process's life as the events tell it: exec, fork, exit, and
//! the folding of exited processes beyond --exited-processes.

use tracer_common::{Event, LiveKey};

use super::{State, MAX_PENDING_EXECS};
use crate::collect::{processes::ProcessIndex, ProcessChange};
use crate::model::peak::ProcessPeak;

impl State {
    /// Process `ev.pid` called exec: its old image's blocks and stacks go.
    pub(super) fn executed(&mut self, ev: &Event) {
        self.heap.drop_process(ev.pid);
        if let Some(t) = &mut self.temporaries {
            t.forget_process(ev.pid);
        }
        self.stacks.forget_process(ev.pid);
        self.modules.forget(ev.pid);
        // Now, not at its first allocation: a short-lived process may be
        // gone by then. The EXEC event wakes us at once; the program and
        // its loader are mapped, the libraries follow (read again when an
        // address falls outside these).
        if self.maps_at_exec {
            self.modules.refresh_now(ev.pid);
        }
        let comm = tracer_common::exec_comm(ev);
        let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
        let comm = String::from_utf8_lossy(&comm[..len]).into_owned();
        self.processes.executed(ev.pid, &comm);
        // Bounded: a backlog beyond this (a host starting programs faster
        // than their objects can be read) loses its oldest, counted and
        // reported.
        if self.execs.len() >= MAX_PENDING_EXECS {
            self.execs.pop_front();
            self.execs_skipped += 1;
        }
        self.execs.push_back(crate::collect::Exec {
            pid: ev.pid,
            from_thread: ev.tid != ev.pid,
        });
        self.process_changes
            .push(ProcessChange::Executed { pid: ev.pid, comm });
    }

    /// Until it execs, a forked child has its parent's mappings and
    /// program: a child that exits before its own maps and command line
    /// are read still gets named frames and a program. A pid seen before
    /// is a new process now.
    pub(super) fn forked(&mut self, child: u32, parent: u32) {
        self.stacks.forget_process(child);
        self.modules.forked(parent, child);
        self.processes.forked(child, parent);
    }

    /// Process `pid` exited and its events are handled: its blocks leave
    /// the heap model and the kernel's LIVE map, and what is kept to
    /// resolve its stacks is dropped.
    /// An OOM victim's blocks stay in use and its process is not folded
    /// (see collect/oom.rs).
    pub(in crate::collect) fn process_gone(&mut self, pid: u32) {
        let victim = self.oom.dying(pid).map(|v| {
            v.heap = Some(self.heap.inuse_of(pid));
        });
        let root = self.trace_root == Some(pid) || victim.is_some();
        let addrs = self.heap.exited(pid, root);
        if let Some(t) = &mut self.temporaries {
            t.forget_process(pid);
        }
        // In exact mode BPF keeps no LIVE entry of a reported block.
        if !self.sampling.is_exact() {
            self.stale_live
                .extend(addrs.into_iter().map(|addr| LiveKey::reported(pid, addr)));
        }
        if let (Some(peak), Some(i)) = (self.heap.take_peak(pid), self.processes.current(pid)) {
            self.ended_peaks.ended(i, peak);
        }
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
                let peak = self.ended_peaks.fold(oldest, group);
                let (stacks, heap, history) =
                    (&mut self.stacks.table, &mut self.heap, &mut self.history);
                let temporaries = &mut self.temporaries;
                stacks.fold(oldest, group, |from, into| {
                    heap.merge(from, into, peak.as_ref());
                    if let Some(t) = temporaries.as_mut() {
                        t.merge(from, into);
                    }
                    if let Some(history) = history.as_mut() {
                        history.merge(from, into);
                    }
                });
            }
        }
    }

    /// The peak of process record `i`: the heap's while it runs, kept
    /// from its exit on (a group's: the sum of its processes' peaks).
    pub fn process_peak(&self, i: ProcessIndex) -> Option<&ProcessPeak> {
        let record = self.processes.get(i)?;
        match record.exited || record.folded > 0 {
            true => self.ended_peaks.get(i),
            false => self.heap.peak(record.pid),
        }
    }

    fn drop_process(&mut self, pid: u32) {
        self.tracked.remove(&pid);
        // The last chance to read its JIT's names (a JIT flushes them at exit).
        self.stacks.table.name_pending(&mut self.modules, Some(pid));
        self.stacks.drop_process(pid);
        self.modules.drop_process(pid);
    }
}
