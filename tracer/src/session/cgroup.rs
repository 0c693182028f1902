//! `--cgroup PATH`: every process of a cgroup v2 subtree. The kernel
//! decides which calls are recorded (tracer-ebpf's FILTER_CGROUP compares
//! the calling task's ancestor cgroup at the subtree's depth with its id),
//! so a process moved in, or started in a cgroup made under it during the
//! trace, is recorded from its next call. User space only makes sure the
//! allocator objects those processes use are hooked: the subtree's
//! processes at the start, each exec in it, and a look at the subtree
//! every POLL_INTERVAL for processes moved in.
//!
//! Where the kernel's verifier does not offer that helper to uprobe
//! programs, the subtree is followed by its process list instead
//! (cgroup_members.rs): the same looks put its processes into the
//! process filter.
//!
//! The path given is what is traced: a cgroup removed and made again at
//! it (a systemd service restarted) is a new cgroup, with a new id, and
//! the same look every POLL_INTERVAL finds it, tells the BPF filter its
//! id, and says on stderr and in the report when the cgroup went and
//! came back.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use super::cgroup_members::Members;
use crate::{
    collect::ProcessChange,
    console, escape,
    probes::{hooks::Hooks, loader::Loaded, CgroupFilter},
    report::{CgroupRemoval, Note},
    tracee::{
        cgroup::{self, TracedCgroup},
        search::Program,
    },
};

/// Removals of the cgroup the report lists one by one; those beyond are
/// counted (a service restarted every second for a day is one note).
const REMOVALS_KEPT: usize = 8;

pub struct Cgroup {
    pub cgroup: TracedCgroup,
    /// The path as given, resolved again when a cgroup is made at it.
    given: PathBuf,
    /// The cgroup at the path was removed and none is there now.
    gone: bool,
    /// When it was removed and made again: the first REMOVALS_KEPT.
    removals: Vec<(Instant, Option<Instant>)>,
    /// Removals beyond those.
    more_removals: u64,
    /// Processes of the subtree whose allocators were looked at: bounded by
    /// the processes in the subtree (those gone leave at the next poll).
    seen: BTreeSet<u32>,
    /// Followed by its process list (the kernel cannot filter by cgroup
    /// here); None where the kernel filters. Freed with the trace.
    members: Option<Members>,
    /// Followed by its process list: the kernel threads met in the subtree
    /// (the root cgroup holds them), kept out of the filter without reading
    /// /proc again. Bounded by the subtree's processes: those no longer in
    /// it leave at each look.
    kernel_threads: BTreeSet<u32>,
    /// --verbose: processes that leave the filter are said.
    verbose: bool,
}

/// MEMTRACE_BPF_TEST_CGROUP_BY_PROCESSES=1: the integration tests follow
/// the cgroup by its process list on a kernel that could filter by it.
pub fn by_processes_forced() -> bool {
    std::env::var_os("MEMTRACE_BPF_TEST_CGROUP_BY_PROCESSES").is_some_and(|v| v == "1")
}

impl Cgroup {
    /// Resolves the path given (errors say which mount to use).
    /// `by_processes`: the kernel cannot filter by cgroup in uprobe
    /// programs, so the subtree is followed by its process list.
    pub fn new(given: &Path, by_processes: bool, verbose: bool) -> anyhow::Result<Cgroup> {
        Ok(Cgroup {
            cgroup: cgroup::resolve(given)?,
            given: given.to_path_buf(),
            gone: false,
            removals: Vec::new(),
            more_removals: 0,
            seen: BTreeSet::new(),
            members: by_processes.then(Members::default),
            kernel_threads: BTreeSet::new(),
            verbose,
        })
    }

    /// Whether the subtree is followed by its process list.
    pub fn by_processes(&self) -> bool {
        self.members.is_some()
    }

    pub fn filter(&self) -> CgroupFilter {
        CgroupFilter {
            id: self.cgroup.id,
            level: self.cgroup.level,
        }
    }

    /// Hooks what this process's program uses (the host's allocators, for
    /// processes started in the subtree later) and the allocators of every
    /// process in the subtree now. The tracer itself is filtered out first
    /// or, followed by its process list, the subtree's processes are put
    /// into the filter before any probe is attached.
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        let me = std::process::id();
        match self.members {
            Some(_) => drop(self.follow_members(loaded)),
            None => loaded.add_filtered_pid(me)?,
        }
        hooks.hook(loaded, &Program::running(me)?, None, None)?;
        hooks.forget(me);
        self.poll(loaded, hooks);
        hooks.drop_vanished(None);
        Ok(())
    }

    /// A process of the subtree exec'ed: hook what its new image uses.
    pub fn on_exec(&mut self, pid: u32, loaded: &mut Loaded, hooks: &mut Hooks) {
        self.seen.insert(pid);
        hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
    }

    /// Processes in the subtree not looked at yet (moved in, or forked
    /// there without exec): their allocators are hooked. Returns them,
    /// whose maps to read now.
    pub fn poll(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> Vec<u32> {
        self.follow_path(loaded);
        let me = std::process::id();
        let now = match self.members {
            Some(_) => self.follow_members(loaded),
            None => self.cgroup.processes(),
        };
        self.seen.retain(|pid| now.binary_search(pid).is_ok());
        let mut found = Vec::new();
        for pid in now {
            if pid == me || !self.seen.insert(pid) || is_kernel_thread(pid) {
                continue;
            }
            if !hooks.knows(pid) {
                hooks.hook_running(loaded, pid, Program::running(pid), None);
            }
            found.push(pid);
        }
        found
    }

    /// Followed by its process list: the subtree's processes now (the
    /// tracer and kernel threads left out) made the filter's, the first
    /// full map said. Returns them.
    fn follow_members(&mut self, loaded: &mut Loaded) -> Vec<u32> {
        let me = std::process::id();
        let Some(members) = &mut self.members else {
            return Vec::new();
        };
        let mut now = self.cgroup.processes();
        let kernel = &mut self.kernel_threads;
        kernel.retain(|pid| now.binary_search(pid).is_ok());
        // /proc is read once for each process new to the subtree.
        now.retain(|&pid| {
            let new = !members.is_traced(pid) && !kernel.contains(&pid);
            if new && is_kernel_thread(pid) {
                kernel.insert(pid);
            }
            pid != me && !kernel.contains(&pid)
        });
        let look = members.sync(&now, loaded);
        let path = escape::text(&self.cgroup.path);
        for pid in look.left.iter().filter(|_| self.verbose) {
            console::say(format_args!(
                "pid {pid} left the cgroup {path}: no longer traced"
            ));
        }
        if look.first_full {
            console::warn(format_args!(
                "the process filter is full ({} processes): processes of the cgroup {path} \
                 beyond it are not traced until others exit or leave it (the report counts them)",
                crate::probes::loader::MAX_FILTERED_PIDS,
            ));
        }
        now
    }

    /// Followed by its process list: children forked in the kernel joined
    /// the filter, processes that exited left it.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        let Some(members) = &mut self.members else {
            return;
        };
        for change in changes {
            match change {
                ProcessChange::Forked { child, .. } => members.forked(child),
                ProcessChange::Exited { pid } => members.exited(pid),
                ProcessChange::Executed { .. } => {}
            }
        }
    }

    /// Whether the path given still names the cgroup traced (its
    /// directory's inode is its id). One removed is no longer traced; one
    /// made at the path (removed and made again between two looks, or
    /// since it was found gone) is traced from now on: the BPF filter
    /// gets its id. Each is said on stderr and kept for the report.
    fn follow_path(&mut self, loaded: &mut Loaded) {
        let id = std::fs::metadata(&self.cgroup.dir).ok().map(|m| m.ino());
        match (self.gone, id) {
            (false, Some(id)) if id == self.cgroup.id => return,
            (true, None) => return,
            _ => {}
        }
        let path = escape::text(&self.cgroup.path).into_owned();
        if !self.gone {
            self.gone = true;
            // Its id names no cgroup now: nothing matches it.
            if let Err(e) = loaded.set_traced_cgroup(0) {
                console::warn(format_args!("{}", escape::text(&format!("{e:#}"))));
            }
            if self.removals.len() < REMOVALS_KEPT {
                self.removals.push((Instant::now(), None));
            } else {
                self.more_removals += 1;
            }
            console::warn(format_args!(
                "the cgroup {path} was removed: its processes are no longer traced; a cgroup \
                 made again at its path will be"
            ));
        }
        // Made again: the same path, so the same depth, under a new id.
        let Ok(made) = cgroup::resolve(&self.given) else {
            return;
        };
        if made.level != self.cgroup.level {
            return;
        }
        if let Err(e) = loaded.set_traced_cgroup(made.id) {
            console::warn(format_args!("{}", escape::text(&format!("{e:#}"))));
            return;
        }
        self.cgroup = made;
        self.gone = false;
        if let Some((_, back @ None)) = self.removals.last_mut() {
            *back = Some(Instant::now());
        }
        console::say(format_args!(
            "the cgroup {path} was made again: its processes are traced from now on"
        ));
    }

    /// What the report says of the cgroup's removals, with times from
    /// `started` (the trace's start).
    pub fn notes(&self, started: Instant) -> Vec<Note> {
        let mut notes = Vec::new();
        if let Some(members) = &self.members {
            notes.push(Note::CgroupByProcesses {
                path: self.cgroup.path.clone(),
                not_traced: members.untraced_total(),
                max_pids: crate::probes::loader::MAX_FILTERED_PIDS,
            });
        }
        if self.removals.is_empty() {
            return notes;
        }
        let since = |t: Instant| t.saturating_duration_since(started);
        notes.push(Note::CgroupRemoved {
            path: self.cgroup.path.clone(),
            removals: self
                .removals
                .iter()
                .map(|&(removed, made_again)| CgroupRemoval {
                    removed: since(removed),
                    made_again: made_again.map(since),
                })
                .collect(),
            more: self.more_removals,
        });
        notes
    }

    /// `cgroup /x/y`, for the report's target.
    pub fn target(&self) -> String {
        format!("cgroup {}", self.cgroup.path)
    }

    /// For stderr, escaped.
    pub fn label(&self) -> String {
        let how = match self.members {
            Some(_) => {
                ", followed by its process list (this kernel's BPF cannot ask a uprobe's cgroup)"
            }
            None => "",
        };
        format!(
            "every process in the cgroup {} and below it{how}",
            crate::escape::text(&self.cgroup.path)
        )
    }
}

fn is_kernel_thread(pid: u32) -> bool {
    crate::tracee::process::read_stat(pid)
        .is_some_and(|stat| crate::tracee::process::is_kernel_thread(&stat))
}
