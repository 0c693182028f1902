//! The links each attached object's probes hold, so that one object's
//! probes can be detached while the others stay: under `--pid`, a process
//! that execs leaves files its new image does not map, and one that execs
//! from a thread other than its main one leaves the task its probes were
//! bound to (see `Single::on_exec`).

use std::{collections::HashMap, os::fd::OwnedFd};

use anyhow::Context as _;
use aya::{
    programs::{uprobe::UProbeLinkId, UProbe},
    Ebpf,
};

use crate::tracee::elf::FileId;

/// Every attached object's links, by file. Bounded by the objects
/// attached (allocator files, a handful per program); an object's entry
/// goes when it is detached, and the rest when the trace ends.
#[derive(Default)]
pub struct Links {
    by_object: HashMap<FileId, ObjectLinks>,
}

#[derive(Default)]
struct ObjectLinks {
    /// Perf-event uprobes, each its program's name and link, in the order
    /// attached (return probes first).
    perf: Vec<(&'static str, UProbeLinkId)>,
    /// uprobe_multi and uprobe session links: closing one detaches it.
    fds: Vec<OwnedFd>,
}

impl Links {
    pub fn add_perf(&mut self, object: FileId, program: &'static str, link: UProbeLinkId) {
        let links = self.by_object.entry(object).or_default();
        links.perf.push((program, link));
    }

    pub fn add_fd(&mut self, object: FileId, link: OwnedFd) {
        self.by_object.entry(object).or_default().fds.push(link);
    }

    /// Detaches every probe of `object`, the last attached first (entry
    /// probes before the return probes their calls need).
    pub fn detach(&mut self, ebpf: &mut Ebpf, object: FileId) -> anyhow::Result<()> {
        let Some(links) = self.by_object.remove(&object) else {
            return Ok(());
        };
        for fd in links.fds.into_iter().rev() {
            drop(fd);
        }
        for (program, link) in links.perf.into_iter().rev() {
            let uprobe: &mut UProbe = ebpf
                .program_mut(program)
                .with_context(|| format!("BPF object has no program {program}"))?
                .try_into()?;
            uprobe
                .detach(link)
                .with_context(|| format!("detaching {program}"))?;
        }
        Ok(())
    }

    /// The fd links of every object, for detaching at the end of the
    /// trace (perf-event probes go with their programs).
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.by_object
            .drain()
            .flat_map(|(_, links)| links.fds)
            .collect()
    }
}
