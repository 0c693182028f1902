//! The loaded object: its control maps and what was learnt loading it,
//! and the maps the collector reads.

use std::{collections::HashMap, os::fd::OwnedFd, os::fd::RawFd};

use anyhow::Context as _;
use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf, StackTraceMap},
    Ebpf,
};
use tracer_common::{LiveKey, LiveValue, CONTROL_SESSION, CONTROL_STOPPED};

use crate::{
    probes::{kernel_features::KernelFeatures, links::Links, map_count::MapCounter, UnwindMode},
    tracee::elf::FileId,
};

/// The loaded object with its probes and control maps.
pub struct Loaded {
    /// Dropping this detaches every probe; None once they are being
    /// detached (`detach_in_background`).
    pub(super) ebpf: Option<Ebpf>,
    pub counters: PerCpuArray<MapData, u64>,
    pub(super) control: Array<MapData, u32>,
    /// CONTROL bits set so far (CONTROL_SESSION once sessions are attached).
    pub(super) control_bits: u32,
    /// The tail-call table of the uprobe session dispatcher.
    pub(super) progs_fd: RawFd,
    /// Every map's fd by name, for the session copies of the programs.
    pub(super) map_fds: HashMap<String, OwnedFd>,
    /// The dispatcher and the session copies it tail-calls.
    pub(super) session_progs: Vec<OwnedFd>,
    /// Each attached object's links (uprobe session, uprobe_multi and
    /// perf-event ones), for detaching one object's probes.
    pub(super) links: Links,
    /// free's programs (the plain one and glibc's) loaded for
    /// uprobe_multi links (with the session copies), by name, when the
    /// kernel took them.
    pub(super) free_multi: HashMap<String, OwnedFd>,
    /// Why uprobe sessions are not used, when they were wanted.
    pub session_error: Option<String>,
    /// How code generations are kept: `Ok(true)` by the fexit program,
    /// `Ok(false)` by the sys_exit tracepoint (why fexit was refused
    /// beside it), `Err` not at all (frames named from the maps as read).
    pub code_gen: Result<(bool, Option<String>), String>,
    /// Tgids traced (FILTER_PIDS) or excluded (FILTER_ALL, FILTER_CGROUP).
    pub(super) traced: aya::maps::HashMap<MapData, u32, u8>,
    /// FILTER_CGROUP: the traced cgroup's id (0: none).
    pub(super) cgroup: Array<MapData, u64>,
    /// The unwind mode the programs were loaded for (a rejected one falls
    /// back to the next).
    pub(super) unwind: UnwindMode,
    pub(super) features: KernelFeatures,
    /// The object as loaded (its kfunc calls resolved for this kernel),
    /// from which the session copies are made.
    pub(super) object: std::sync::Arc<[u8]>,
    /// Why an earlier mode was not used.
    pub(super) fallback: Option<String>,
    /// Each program's verified instructions, largest first.
    pub(super) verified: Vec<(String, u32)>,
    /// Loaded ahead of the trace (ahead.rs) rather than for it.
    pub loaded_ahead: bool,
}

/// The maps the collector reads events and stacks from.
pub struct EventMaps {
    pub events: RingBuf<MapData>,
    pub stacks: StackTraceMap<MapData>,
    /// Recorded live blocks; user space deletes those of exited processes.
    pub live: aya::maps::HashMap<MapData, LiveKey, LiveValue>,
    /// Counts LIVE's entries (--verbose).
    pub live_count: MapCounter,
    /// `--unwind tables`: the rows and mappings the kernel walks with.
    pub unwind: Option<crate::stacks::kernel_tables::BpfUnwindMaps>,
    /// Each process's code generation (tracer-ebpf code_gen.rs).
    /// Taken by the session for `Modules`.
    pub code_gens: Option<crate::stacks::modules::BpfCodeGens>,
}

impl Loaded {
    /// Adds `pid` to the TRACED map (see tracer_common::FILTER_*).
    pub fn add_filtered_pid(&mut self, pid: u32) -> anyhow::Result<()> {
        self.traced
            .insert(pid, 1, 0)
            .with_context(|| format!("adding pid {pid} to the process filter"))
    }

    /// --cgroup: the cgroup whose subtree is traced from now on, by its
    /// id (0: none, as while the path given names no cgroup).
    pub fn set_traced_cgroup(&mut self, id: u64) -> anyhow::Result<()> {
        self.cgroup
            .set(0, id, 0)
            .context("setting the traced cgroup")
    }

    /// Detaches every probe of the attached file `object` (none: nothing).
    pub fn detach_object(&mut self, object: FileId) -> anyhow::Result<()> {
        let ebpf = self
            .ebpf
            .as_mut()
            .context("the probes are being detached")?;
        self.links.detach(ebpf, object)
    }

    pub fn remove_filtered_pid(&mut self, pid: u32) -> anyhow::Result<()> {
        self.traced
            .remove(&pid)
            .with_context(|| format!("removing pid {pid} from the process filter"))
    }

    /// Instructions the verifier processed for each program, largest
    /// first (empty before 5.16, which does not report them).
    pub fn verified_instructions(&self) -> &[(String, u32)] {
        &self.verified
    }

    /// The unwind mode the programs run in.
    pub fn unwind(&self) -> UnwindMode {
        self.unwind
    }

    /// Why the mode asked for was not used, when it was not.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The mode in words, for the line said at the start and the report.
    pub fn mode_line(&self, sessions: bool) -> String {
        let probes = if sessions && self.features.uprobe_session {
            "uprobe sessions where they attach"
        } else {
            "uprobes + uretprobes"
        };
        let ahead = if self.loaded_ahead {
            ", loaded ahead (settings in a map)"
        } else {
            ""
        };
        format!(
            "kernel {}: mode: unwind {}, {probes}, {}{ahead}",
            self.features.release,
            self.unwind.name(),
            self.features.inflight_words()
        )
    }

    /// Whether any allocating function runs as a uprobe session.
    pub fn sessions_attached(&self) -> bool {
        self.control_bits & CONTROL_SESSION != 0
    }

    /// Ends the trace at this instant: entry and free probes turn into
    /// no-ops (calls already inside the allocator still complete), so the
    /// heap is not changed by what happens while the probes are detached.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.set_control(CONTROL_STOPPED)
            .context("telling the BPF programs to stop")
    }

    pub(super) fn set_control(&mut self, bit: u32) -> anyhow::Result<()> {
        self.control_bits |= bit;
        self.control.set(0, self.control_bits, 0)?;
        Ok(())
    }
}
