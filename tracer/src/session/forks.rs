//! The children of a traced process (`--pid` or a command).
//!
//! With `--follow-forks` every process forked by a traced one joins the
//! traced set in the kernel at fork (tracer-ebpf's process_fork), and
//! leaves it when it exits (process_exit); user space learns of both
//! from events and keeps the list of processes for the report. Without
//! it, the kernel counts the children that were not traced, and the report
//! says how many.

use std::collections::BTreeMap;

use aya::maps::{MapData, PerCpuArray};
use tracer_common::counter;

use crate::{
    probes::counters::read_counter,
    report::{Note, ProcessInfo},
    tracee::process::read_cmdline,
};

#[derive(Debug, Default)]
pub struct Forks {
    pub follow: bool,
    /// Followed processes other than the root, by pid.
    children: BTreeMap<u32, Child>,
}

#[derive(Debug)]
struct Child {
    command: String,
    exited: bool,
}

impl Forks {
    pub fn new(follow: bool) -> Forks {
        Forks {
            follow,
            children: BTreeMap::new(),
        }
    }

    /// A followed process forked `child` (already traced, in the kernel).
    /// A pid seen before belongs to a new process now. `parent_command`:
    /// what the parent runs, which the child runs too until it execs (the
    /// exec event reads the command line again).
    pub fn forked(&mut self, child: u32, parent_command: &str) {
        let mut command = read_cmdline(child);
        if command.is_empty() {
            // Already exited: it ran what its parent runs, unless it
            // exec'ed, and then the exec event has the same problem.
            command = parent_command.to_string();
        }
        self.children.insert(
            child,
            Child {
                command,
                exited: false,
            },
        );
    }

    /// The command line of followed child `pid`, if it is one.
    pub fn command(&self, pid: u32) -> Option<&str> {
        self.children.get(&pid).map(|c| c.command.as_str())
    }

    pub fn exited(&mut self, pid: u32) {
        if let Some(child) = self.children.get_mut(&pid) {
            child.exited = true;
        }
    }

    /// A followed child called exec: true when `pid` is one that runs.
    pub fn executed(&mut self, pid: u32) -> bool {
        match self.children.get_mut(&pid) {
            Some(child) if !child.exited => {
                let command = read_cmdline(pid);
                if !command.is_empty() {
                    child.command = command;
                }
                true
            }
            _ => false,
        }
    }

    /// A followed child's exec, in event order: named by its command line
    /// if it still runs, else by the name the kernel gave its new image.
    pub fn renamed(&mut self, pid: u32, comm: &str) {
        if let Some(child) = self.children.get_mut(&pid) {
            let command = read_cmdline(pid);
            child.command = if command.is_empty() {
                comm.to_string()
            } else {
                command
            };
        }
    }

    /// The descendants of `root` running now (before the trace started),
    /// parents before children, from the parent pids in /proc/PID/stat.
    pub fn descendants(root: u32) -> Vec<(u32, u32)> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let parents: Vec<(u32, u32)> = entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter_map(|pid: u32| Some((pid, parent_pid(pid)?)))
            .collect();
        let mut found = Vec::new();
        let mut frontier = vec![root];
        while let Some(parent) = frontier.pop() {
            for &(pid, ppid) in &parents {
                if ppid == parent && pid != root && !found.iter().any(|&(p, _)| p == pid) {
                    found.push((pid, parent));
                    frontier.push(pid);
                }
            }
        }
        found
    }

    /// Adds what the fork events told about the followed children to the
    /// report's process list (`all`: the processes events came from):
    /// command lines the events lacked, exits, and children that made no
    /// allocation.
    pub fn merge_processes(&self, all: &mut Vec<ProcessInfo>) {
        for (&pid, c) in &self.children {
            // The latest process with the pid: a reused pid is a newer child.
            match all.iter_mut().rev().find(|p| p.pid == pid) {
                Some(p) => {
                    if p.command.is_empty() {
                        p.command.clone_from(&c.command);
                    }
                    p.exited |= c.exited;
                }
                None => all.push(process(pid, c.command.clone(), c.exited)),
            }
        }
    }

    /// What the report says about children: how many were not traced
    /// (without --follow-forks) or could not be (with it), as counted in
    /// the kernel.
    pub fn notes(&self, root: u32, counters: &PerCpuArray<MapData, u64>) -> Vec<Note> {
        let mut notes = Vec::new();
        let children = read_counter(counters, counter::CHILD_NOT_TRACED);
        if children > 0 {
            notes.push(Note::ChildrenNotTraced { children, root });
        }
        let children = read_counter(counters, counter::CHILD_NOT_FOLLOWED);
        if children > 0 {
            notes.push(Note::ChildrenNotFollowed {
                children,
                max_pids: crate::probes::loader::MAX_FILTERED_PIDS,
            });
        }
        notes
    }
}

fn process(pid: u32, command: String, exited: bool) -> ProcessInfo {
    ProcessInfo {
        pid,
        start_time: (!exited)
            .then(|| crate::tracee::liveness::start_time(pid))
            .flatten(),
        program: crate::tracee::process::program_of(pid).unwrap_or_default(),
        command,
        exited,
        exit_status: None,
        allocators: Vec::new(),
        folded: 0,
        oom_killed: None,
        temporary: None,
        peak: None,
        identity: match exited {
            true => crate::report::Identity::default(),
            false => crate::tracee::identity::read(pid),
        },
    }
}

/// The parent pid field of /proc/PID/stat (the 4th; the command name
/// before it is in parentheses and may itself contain spaces and ')').
fn parent_pid(pid: u32) -> Option<u32> {
    parse_parent(&crate::tracee::process::read_stat(pid)?)
}

fn parse_parent(stat: &str) -> Option<u32> {
    crate::tracee::process::stat_field(stat, 4)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_pid_is_read_past_a_hostile_command_name() {
        assert_eq!(parse_parent("42 (a) b) 1 S) S 7 42 42 0"), Some(7));
        assert_eq!(parse_parent("42 (sh) S 1 42 42"), Some(1));
        assert_eq!(parse_parent("42 (sh"), None);
        assert_eq!(parse_parent("42 (sh) S x"), None);
    }

    #[test]
    fn a_forked_child_is_listed_once_and_a_reused_pid_is_a_new_process() {
        let mut forks = Forks::new(true);
        // Pids far above pid_max: /proc has none, command lines are empty.
        forks.forked(u32::MAX - 1, "");
        forks.exited(u32::MAX - 1);
        let seen = |command: &str, pid: u32| ProcessInfo {
            pid,
            command: command.to_string(),
            ..ProcessInfo::default()
        };
        let mut listed = vec![seen("root", 10), seen("", u32::MAX - 1)];
        forks.merge_processes(&mut listed);
        let summary: Vec<(u32, &str, bool)> = listed
            .iter()
            .map(|p| (p.pid, p.command.as_str(), p.exited))
            .collect();
        assert_eq!(summary, [(10, "root", false), (u32::MAX - 1, "", true)]);
        forks.forked(u32::MAX - 1, "parent args");
        assert_eq!(forks.command(u32::MAX - 1), Some("parent args"));
        let mut listed = vec![seen("child", u32::MAX - 1)];
        forks.merge_processes(&mut listed);
        assert!(!listed[0].exited);
        let mut listed = Vec::new();
        forks.merge_processes(&mut listed);
        assert_eq!(listed[0].command, "parent args", "a child with no event");
        assert!(forks.executed(u32::MAX - 1));
        assert_eq!(forks.command(u32::MAX - 1), Some("parent args"));
        forks.renamed(u32::MAX - 1, "ls");
        assert_eq!(forks.command(u32::MAX - 1), Some("ls"));
        assert!(!forks.executed(12));
    }

    #[test]
    fn descendants_of_this_test_include_a_child_it_started() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep");
        let me = std::process::id();
        let found = Forks::descendants(me);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&(child.id(), me)), "{found:?}");
    }
}
