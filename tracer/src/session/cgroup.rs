//! `--cgroup PATH`: every process of a cgroup v2 subtree. The kernel
//! decides which calls are recorded (tracer-ebpf's FILTER_CGROUP compares
//! the calling task's ancestor cgroup at the subtree's depth with its id),
//! so a process moved in, or started in a cgroup made under it during the
//! trace, is recorded from its next call. User space only makes sure the
//! allocator objects those processes use are hooked: the subtree's
//! processes at the start, each exec in it, and a look at the subtree
//! every POLL_INTERVAL for processes moved in.

use std::{collections::BTreeSet, path::Path};

use crate::{
    probes::{hooks::Hooks, loader::Loaded, CgroupFilter},
    tracee::{
        cgroup::{self, TracedCgroup},
        search::Program,
    },
};

pub struct Cgroup {
    pub cgroup: TracedCgroup,
    /// Processes of the subtree whose allocators were looked at: bounded by
    /// the processes in the subtree (those gone leave at the next poll).
    seen: BTreeSet<u32>,
}

impl Cgroup {
    /// Resolves the path given (errors say which mount to use).
    pub fn new(given: &Path) -> anyhow::Result<Cgroup> {
        Ok(Cgroup {
            cgroup: cgroup::resolve(given)?,
            seen: BTreeSet::new(),
        })
    }

    pub fn filter(&self) -> CgroupFilter {
        CgroupFilter {
            id: self.cgroup.id,
            level: self.cgroup.level,
        }
    }

    /// Hooks what this process's program uses (the host's allocators, for
    /// processes started in the subtree later) and the allocators of every
    /// process in the subtree now. The tracer itself is filtered out first.
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        let me = std::process::id();
        loaded.add_filtered_pid(me)?;
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
        let me = std::process::id();
        let now = self.cgroup.processes();
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

    /// `cgroup /x/y`, for the report's target.
    pub fn target(&self) -> String {
        format!("cgroup {}", self.cgroup.path)
    }

    /// For stderr, escaped.
    pub fn label(&self) -> String {
        format!(
            "every process in the cgroup {} and below it",
            crate::escape::text(&self.cgroup.path)
        )
    }
}

fn is_kernel_thread(pid: u32) -> bool {
    crate::tracee::process::read_stat(pid)
        .is_some_and(|stat| crate::tracee::process::is_kernel_thread(&stat))
}
