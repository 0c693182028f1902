//! The children of a traced process (`--pid` or a command).
//!
//! With `--follow-forks` every process forked by a traced one joins the
//! traced set in the kernel at fork (tracer-ebpf's process_fork), and
//! leaves it when it exits (process_exit); user space learns of both
//! from events and keeps the list of processes for the report. Without
//! it, the kernel counts the children that were not traced, and the report
//! says how many.

use std::collections::{BTreeMap, VecDeque};

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
    /// Followed processes other than the root, by pid: those running and
    /// the last `keep_exited` that exited.
    children: BTreeMap<u32, Child>,
    /// Exits of children, oldest first, with the exit's number: past
    /// `keep_exited` (--exited-processes) the oldest child is forgotten,
    /// as the collector folds its stacks into its program's group. So a
    /// trace that forks without end keeps this bounded, and the report
    /// lists a folded child only in its group. One entry per exited child
    /// in `children`.
    exits: VecDeque<(u32, u64)>,
    keep_exited: usize,
    /// Exits seen, to number them.
    exit_count: u64,
}

#[derive(Debug)]
struct Child {
    command: String,
    exited: bool,
    /// The number of its exit (0 while it runs).
    exit: u64,
}

impl Forks {
    pub fn new(follow: bool, keep_exited: usize) -> Forks {
        Forks {
            follow,
            children: BTreeMap::new(),
            exits: VecDeque::new(),
            keep_exited,
            exit_count: 0,
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
        let replaced = self.children.insert(
            child,
            Child {
                command,
                exited: false,
                exit: 0,
            },
        );
        if let Some(old) = replaced.filter(|c| c.exited) {
            // A reused pid: the old child's exit goes with it (a search of
            // at most --exited-processes entries, at a reuse only).
            self.exits.retain(|&(p, e)| (p, e) != (child, old.exit));
        }
    }

    /// The command line of followed child `pid`, if it is one.
    pub fn command(&self, pid: u32) -> Option<&str> {
        self.children.get(&pid).map(|c| c.command.as_str())
    }

    pub fn exited(&mut self, pid: u32) {
        let Some(child) = self.children.get_mut(&pid).filter(|c| !c.exited) else {
            return;
        };
        self.exit_count += 1;
        child.exited = true;
        child.exit = self.exit_count;
        self.exits.push_back((pid, self.exit_count));
        while self.exits.len() > self.keep_exited {
            if let Some((pid, _)) = self.exits.pop_front() {
                self.children.remove(&pid);
            }
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
                None => all.push(super::facts::process_info(pid, c.command.clone(), c.exited)),
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
        notes.extend(not_followed(counters));
        notes
    }
}

/// Children the kernel could not put in the process filter (full), as
/// counted there.
pub fn not_followed(counters: &PerCpuArray<MapData, u64>) -> Option<Note> {
    let children = read_counter(counters, counter::CHILD_NOT_FOLLOWED);
    (children > 0).then_some(Note::ChildrenNotFollowed {
        children,
        max_pids: crate::probes::loader::MAX_FILTERED_PIDS,
    })
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
        let mut forks = Forks::new(true, 1000);
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

    /// A long trace forks without end: exited children past
    /// --exited-processes are forgotten, as the collector folds their
    /// stacks into their program's group (they were kept for ever, and
    /// listed once more beside the group).
    #[test]
    fn exited_children_past_the_bound_are_forgotten() {
        let mut forks = Forks::new(true, 2);
        let pids: Vec<u32> = (1..=5).map(|i| u32::MAX - 10 - i).collect();
        for &pid in &pids {
            forks.forked(pid, "child");
        }
        for &pid in &pids[..4] {
            forks.exited(pid);
        }
        // A pid reused by a new child that exits: its first exit's turn
        // must not forget the new one.
        forks.forked(pids[3], "again");
        forks.exited(pids[3]);
        forks.exited(pids[3]);
        let mut listed = Vec::new();
        forks.merge_processes(&mut listed);
        let mut kept: Vec<(u32, &str, bool)> = listed
            .iter()
            .map(|p| (p.pid, p.command.as_str(), p.exited))
            .collect();
        kept.sort_unstable();
        assert_eq!(
            kept,
            [
                (pids[4], "child", false),
                (pids[3], "again", true),
                (pids[2], "child", true),
            ]
        );
        assert_eq!(forks.children.len(), 3);
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
