//! The processes a trace recorded allocations from, each identified by its
//! pid and start time: a pid reused by a later process is a new entry,
//! never a rename of the old one, and an exec keeps the entry (same process,
//! new program).
//!
//! Bounded by the number of processes that allocated during the trace
//! (about 200 bytes each, command lines cut at `target::MAX_CMDLINE`), kept
//! for the report until the trace ends.

use std::collections::HashMap;

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
    /// argv[0] (see `target::process::program_of`), "" when unknown.
    pub program: String,
    /// Its exit was seen.
    pub exited: bool,
}

#[derive(Debug, Default)]
pub struct ProcessTable {
    records: Vec<ProcessRecord>,
    /// The running process of each pid.
    current: HashMap<u32, ProcessIndex>,
    /// --binary: the program every traced process runs, for those gone
    /// before their command line could be read.
    pub program_hint: Option<String>,
}

impl ProcessTable {
    /// The running process `pid`, entered at its first event with its
    /// command line and program read now (a short-lived process may be
    /// gone by the report).
    pub fn instance(&mut self, pid: u32, start_time: Option<u64>) -> ProcessIndex {
        if let Some(&i) = self.current.get(&pid) {
            return i;
        }
        let command = crate::target::process::read_cmdline(pid);
        let program = crate::target::process::program_of(pid)
            .or_else(|| self.program_hint.clone())
            .unwrap_or_default();
        self.insert(ProcessRecord {
            pid,
            start_time,
            command,
            program,
            exited: false,
        })
    }

    fn insert(&mut self, record: ProcessRecord) -> ProcessIndex {
        let i = self.records.len() as ProcessIndex;
        self.current.insert(record.pid, i);
        self.records.push(record);
        i
    }

    /// Process `pid` called exec: same process, new command line (the
    /// kernel's name `comm` for the new image when it is gone already).
    pub fn executed(&mut self, pid: u32, comm: &str) {
        let Some(&i) = self.current.get(&pid) else {
            return;
        };
        let record = &mut self.records[i as usize];
        record.command = crate::target::process::read_cmdline(pid);
        if record.command.is_empty() {
            record.command = comm.to_string();
        }
        record.program =
            crate::target::process::program_of(pid).unwrap_or_else(|| comm.to_string());
    }

    /// Process `pid` exited: a later process with its pid is a new entry.
    pub fn exited(&mut self, pid: u32) {
        if let Some(i) = self.current.remove(&pid) {
            self.records[i as usize].exited = true;
        }
    }

    pub fn get(&self, i: ProcessIndex) -> Option<&ProcessRecord> {
        self.records.get(i as usize)
    }

    /// Every process, in the order they were first seen.
    pub fn iter(&self) -> impl Iterator<Item = &ProcessRecord> {
        self.records.iter()
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
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
    }
}
