//! What the probes and the target inspection found, as the report shows
//! it: the report receives facts and renders them, and probes/ and
//! tracee/ know nothing of the report.

use crate::{
    probes::plan::HookFact,
    report::{Hook, ProcessAllocator, ProcessInfo},
    tracee::allocators::Hooked,
};

/// One report line per entry point; `status` in the words the report has
/// always used (`HookStatus`'s Display).
pub fn report_hooks(facts: &[HookFact]) -> Vec<Hook> {
    facts
        .iter()
        .map(|f| Hook {
            function: f.function.clone(),
            module: f.module.clone(),
            offset: f.offset,
            probe_offset: f.probe_offset,
            placement: f.placement.clone(),
            status: f.status.to_string(),
        })
        .collect()
}

/// The allocator objects a process uses, for the report's process list.
pub fn process_allocators(objects: &[Hooked]) -> Vec<ProcessAllocator> {
    objects
        .iter()
        .map(|o| ProcessAllocator {
            kind: o.kind.name().to_string(),
            path: o.path.to_string_lossy().into_owned(),
            resolves_malloc: o.resolves_malloc,
            functions: o.entry_points.iter().map(|e| e.name.clone()).collect(),
        })
        .collect()
}

/// A process no event described, as /proc shows it now (nothing of it is
/// read once it `exited`): the one constructor for the scopes' processes.
pub fn process_info(pid: u32, command: String, exited: bool) -> ProcessInfo {
    ProcessInfo {
        pid,
        start_time: (!exited)
            .then(|| crate::tracee::liveness::start_time(pid))
            .flatten(),
        program: match exited {
            true => String::new(),
            false => crate::tracee::process::program_of(pid).unwrap_or_default(),
        },
        command,
        exited,
        identity: match exited {
            true => crate::report::Identity::default(),
            false => crate::tracee::identity::read(pid),
        },
        ..ProcessInfo::default()
    }
}
