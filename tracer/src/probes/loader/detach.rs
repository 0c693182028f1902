//! Detaching every probe at the end of a trace, on a thread of its own.

use std::os::fd::OwnedFd;

use anyhow::Context as _;
use aya::Ebpf;
use tracer_common::names::program;

use super::{
    attach::{uprobe, RETURN_PROGRAM},
    kernel_programs::{CODE_GEN_PROGRAM, CODE_GEN_SYSCALL_PROGRAM, TRACEPOINTS},
    loaded::Loaded,
};

/// Probes being detached on a thread of their own (`detach_in_background`).
pub struct Detaching(std::thread::JoinHandle<anyhow::Result<()>>);

impl Loaded {
    /// Starts detaching every probe, entry probes before the return probe,
    /// on a thread of its own, and returns at once. Call after `stop` (the
    /// probes are no-ops then: what they still see changes nothing) and
    /// after the last attach. The maps stay: the report reads the counters
    /// and the collector its maps as before. The kernel waits for a grace
    /// period on each uprobe link it removes (0.05-0.25 s each here, idle,
    /// not CPU): spent while the report is built, not after it.
    pub fn detach_in_background(&mut self) -> Detaching {
        let links = self.links.take_fds();
        let progs = std::mem::take(&mut self.session_progs);
        let ebpf = self.ebpf.take();
        Detaching(std::thread::spawn(move || detach(links, progs, ebpf)))
    }
}

impl Detaching {
    /// Waits until every probe is detached.
    pub fn wait(self) -> anyhow::Result<()> {
        self.0
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the thread detaching the probes panicked")))
    }
}

/// Detaches every probe, entry probes before the return probe. The kernel
/// synchronizes on each uprobe it removes, so this takes a moment.
fn detach(
    session_links: Vec<OwnedFd>,
    session_progs: Vec<OwnedFd>,
    ebpf: Option<Ebpf>,
) -> anyhow::Result<()> {
    drop(session_links);
    drop(session_progs);
    let Some(mut ebpf) = ebpf else {
        return Ok(());
    };
    let mut programs: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    programs.retain(|n| {
        n != CODE_GEN_PROGRAM
            && n != CODE_GEN_SYSCALL_PROGRAM
            && TRACEPOINTS.iter().all(|(p, _)| p != n)
    });
    programs.sort_by_key(|n| n == RETURN_PROGRAM || n == program::NOOP_RETURN);
    for name in programs {
        uprobe(&mut ebpf, &name)?
            .unload()
            .with_context(|| format!("detaching {name}"))?;
    }
    Ok(())
}
