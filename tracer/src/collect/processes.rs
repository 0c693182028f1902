//! The processes a trace recorded allocations from, each identified by its
//! pid and start time: a pid reused by a later process is a new entry,
//! never a rename of the old one, and an exec keeps the entry (same process,
//! new program).
//!
//! Bounded: a record is about 200 bytes (command lines cut at
//! `MAX_CMDLINE`), plus its identity (cgroup path and program cut at 4 KiB,
//! see tracee/identity.rs); the collector folds exited processes beyond the last
//! `--exited-processes` into one group record per program (`fold`), whose
//! slot is then reused.

use crate::hashing::FastMap;
use std::collections::HashMap;

use crate::profile::Identity;

/// Index of a process in the table.
pub type ProcessIndex = u32;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRecord {
    pub pid: u32,
    /// Clock ticks after boot when it started (/proc/PID/stat field 22);
    /// None when it was gone before it could be read.
    pub start_time: Option<u64>,
    /// Command line as read at its first event or exec ("" when unknown).
    pub command: String,
    /// argv[0] (see `tracee::process::program_of`), "" when unknown.
    pub program: String,
    /// Its exit was seen.
    pub exited: bool,
    /// It called exec during the trace: addresses of an image it left
    /// before its maps were read have no module.
    pub executed: bool,
    /// 0 for a process. A group record (pid 0) stands for this many exited
    /// processes of `program`, folded into it with their stacks.
    pub folded: u64,
    /// Its cgroup, container, namespace pid, read with its command line.
    pub identity: Identity,
}

#[derive(Debug, Default)]
pub struct ProcessTable {
    /// Indexed by `ProcessIndex`; None: a slot freed by `fold`.
    records: Vec<Option<ProcessRecord>>,
    free: Vec<ProcessIndex>,
    /// The running process of each pid.
    current: FastMap<u32, ProcessIndex>,
    /// The group record of each program.
    groups: HashMap<String, ProcessIndex>,
    /// --binary: the program every traced process runs, for those gone
    /// before their command line could be read.
    program_hint: Option<String>,
    /// Children forked and not yet entered, with their parent (pid and
    /// record): until it execs, a child runs its parent's program, which
    /// names it if it is gone before its command line is read. An entry
    /// goes when the child is entered or exits; at most `MAX_FORKED`.
    forked: FastMap<u32, (u32, ProcessIndex)>,
}

/// Most children remembered by `ProcessTable::forked` at once.
const MAX_FORKED: usize = 1 << 16;

impl ProcessTable {
    /// A table whose processes gone before they were named are taken to
    /// run `program_hint` (--binary's program).
    pub fn new(program_hint: Option<String>) -> ProcessTable {
        ProcessTable {
            program_hint,
            ..ProcessTable::default()
        }
    }

    /// The running process `pid`, entered at its first event with its
    /// command line and program read now (a short-lived process may be
    /// gone by the report). Nothing is read when /proc shows a process
    /// that started at another time than `start_time`: the pid is another
    /// process's now.
    pub fn instance(&mut self, pid: u32, start_time: Option<u64>) -> ProcessIndex {
        if let Some(&i) = self.current.get(&pid) {
            return i;
        }
        let same = start_time.is_none() || crate::tracee::liveness::start_time(pid) == start_time;
        let (mut command, mut program) = match same {
            true => crate::tracee::process::command_and_program(pid),
            false => (String::new(), None),
        };
        let parent = self
            .forked
            .remove(&pid)
            .and_then(|(ppid, i)| self.get(i).filter(|r| r.pid == ppid));
        if let (None, "", Some(parent)) = (&program, command.as_str(), parent) {
            command.clone_from(&parent.command);
            program = Some(parent.program.clone()).filter(|p| !p.is_empty());
        }
        let program = program
            .or_else(|| self.program_hint.clone())
            .unwrap_or_default();
        self.insert(ProcessRecord {
            pid,
            start_time,
            command,
            program,
            exited: false,
            executed: false,
            folded: 0,
            identity: match same {
                true => crate::tracee::identity::read(pid),
                false => Identity::default(),
            },
        })
    }

    fn insert(&mut self, record: ProcessRecord) -> ProcessIndex {
        let pid = record.pid;
        let i = match self.free.pop() {
            Some(i) => {
                self.records[i as usize] = Some(record);
                i
            }
            None => {
                self.records.push(Some(record));
                (self.records.len() - 1) as ProcessIndex
            }
        };
        if pid != 0 {
            self.current.insert(pid, i);
        }
        i
    }

    /// The running process `pid`, if it has a record.
    pub fn current(&self, pid: u32) -> Option<ProcessIndex> {
        self.current.get(&pid).copied()
    }

    /// Exited process `i` is folded into its program's group record, which
    /// is returned; its own record goes.
    pub fn fold(&mut self, i: ProcessIndex) -> Option<ProcessIndex> {
        let record = self.records.get_mut(i as usize)?.take()?;
        let program = match record.program.as_str() {
            "" => record
                .command
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
            program => program.to_string(),
        };
        let group = match self.groups.get(&program) {
            Some(&g) => g,
            None => {
                let g = self.insert(ProcessRecord {
                    pid: 0,
                    start_time: None,
                    command: String::new(),
                    program: program.clone(),
                    exited: true,
                    executed: false,
                    folded: 0,
                    identity: Identity::default(),
                });
                self.groups.insert(program, g);
                g
            }
        };
        if let Some(Some(g)) = self.records.get_mut(group as usize) {
            g.folded += 1;
        }
        // Freed only now: the group's record must not take its slot.
        self.free.push(i);
        Some(group)
    }

    /// Process `pid` called exec: same process, new command line (the
    /// kernel's name `comm` for the new image when it is gone already).
    pub fn executed(&mut self, pid: u32, comm: &str) {
        // A new image: its children forked before run the old one, and it
        // no longer runs its parent's.
        self.forked.remove(&pid);
        self.forked.retain(|_, (parent, _)| *parent != pid);
        let Some(Some(record)) = self
            .current
            .get(&pid)
            .and_then(|&i| self.records.get_mut(i as usize))
        else {
            return;
        };
        let (command, program) = crate::tracee::process::command_and_program(pid);
        record.command = match command.is_empty() {
            true => comm.to_string(),
            false => command,
        };
        record.program = program.unwrap_or_else(|| comm.to_string());
        record.executed = true;
        // A new image: a new program as its root shows it; gone already,
        // the identity read before stands.
        let identity = crate::tracee::identity::read(pid);
        if identity.cgroup.is_some() {
            record.identity = identity;
        }
    }

    /// Process `parent` forked `child`: until the child execs or is
    /// entered, it is known to run the parent's program.
    pub fn forked(&mut self, child: u32, parent: u32) {
        self.forked.remove(&child);
        if let Some(&i) = self.current.get(&parent) {
            if self.forked.len() < MAX_FORKED {
                self.forked.insert(child, (parent, i));
            }
        }
    }

    /// Process `pid` exited: a later process with its pid is a new entry.
    pub fn exited(&mut self, pid: u32) {
        self.forked.remove(&pid);
        let i = self.current.remove(&pid);
        if let Some(Some(record)) = i.and_then(|i| self.records.get_mut(i as usize)) {
            record.exited = true;
        }
    }

    pub fn get(&self, i: ProcessIndex) -> Option<&ProcessRecord> {
        self.records.get(i as usize)?.as_ref()
    }

    /// Every process and group record, with its index.
    pub fn indexed(&self) -> impl Iterator<Item = (ProcessIndex, &ProcessRecord)> {
        self.records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i as ProcessIndex, r.as_ref()?)))
    }

    /// Every process and group record.
    pub fn iter(&self) -> impl Iterator<Item = &ProcessRecord> {
        self.records.iter().flatten()
    }

    /// The pids of running processes, the first entered first; at most
    /// `max`.
    pub fn running_pids(&self, max: usize) -> Vec<u32> {
        let mut running: Vec<(ProcessIndex, u32)> =
            self.current.iter().map(|(&pid, &i)| (i, pid)).collect();
        running.sort_unstable();
        running.into_iter().take(max).map(|(_, pid)| pid).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_is_a_new_process_and_an_exec_is_the_same_one() {
        let mut t = ProcessTable::default();
        let gone = u32::MAX - 7;
        let first = t.instance(gone, Some(100));
        assert_eq!(t.instance(gone, Some(100)), first);
        t.executed(gone, "newname");
        assert_eq!(t.instance(gone, Some(100)), first, "exec: same process");
        assert_eq!(t.get(first).map(|r| r.command.as_str()), Some("newname"));
        t.exited(gone);
        let second = t.instance(gone, Some(200));
        assert_ne!(second, first, "pid reuse: a new process");
        let records: Vec<_> = t
            .iter()
            .map(|r| (r.pid, r.start_time, r.exited, r.command.as_str()))
            .collect();
        assert_eq!(
            records,
            [
                (gone, Some(100), true, "newname"),
                (gone, Some(200), false, "")
            ]
        );
        // Folded: the record goes, a group for its program counts it, and
        // its slot serves the next process.
        let group = t.fold(first).expect("a group");
        assert!(t.get(first).is_none());
        assert_eq!(
            t.get(group).map(|g| (g.pid, g.folded, g.program.as_str())),
            Some((0, 1, "newname"))
        );
        assert_eq!(t.fold(first), None, "folded once");
        assert_eq!(t.instance(gone - 1, None), first, "slot reused");
    }

    #[test]
    fn a_pid_now_another_process_s_is_not_read_for_the_one_that_had_it() {
        let mut t = ProcessTable::default();
        let pid = std::process::id();
        let start = crate::tracee::liveness::start_time(pid).expect("own start");
        // An event of an earlier process with this pid, which started
        // before this one: /proc shows this one, whose command is not its.
        let earlier = t.instance(pid, Some(start - 1));
        let record = t.get(earlier).expect("record");
        assert_eq!((record.command.as_str(), record.program.as_str()), ("", ""));
        assert_eq!(record.identity, Identity::default());
    }

    #[test]
    fn a_forked_child_gone_before_it_was_read_runs_its_parents_program() {
        let mut t = ProcessTable::default();
        let parent = std::process::id();
        let (child, execed) = (u32::MAX - 9, u32::MAX - 10);
        let p = t.instance(parent, crate::tracee::liveness::start_time(parent));
        t.forked(child, parent);
        t.forked(execed, parent);
        t.executed(execed, "other");
        let c = t.instance(child, Some(2));
        let own = t.get(p).map(|r| (r.command.clone(), r.program.clone()));
        let inherited = t.get(c).map(|r| (r.command.clone(), r.program.clone()));
        assert!(own.as_ref().is_some_and(|(_, program)| !program.is_empty()));
        assert_eq!(inherited, own);
        let e = t.instance(execed, Some(3));
        assert_eq!(
            t.get(e).map(|r| r.program.as_str()),
            Some(""),
            "exec'ed: not the parent's"
        );
        t.exited(child);
        t.exited(execed);
        assert!(t.forked.is_empty());
    }
}
