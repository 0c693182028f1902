//! The notes at the end of a profile: what was hooked, what the scope and
//! the processes' exits mean for the numbers, what was lost, and why stacks
//! end early.

use crate::{
    collect::{collector::Collector, meta::Meta},
    probes::UnwindMode,
    profile::{Losses, NotFreedAtExit, Note, StackReport},
};

/// Stacks of processes that exited before their maps could be read (in
/// full): their addresses outside the maps read have no names.
#[derive(Default)]
pub(super) struct Unnamed {
    pub(super) stacks: u64,
    /// Of those, marked truncated (the unwinder had no module to go on).
    pub(super) truncated: u64,
    pub(super) pids: std::collections::BTreeSet<u32>,
}

pub(super) fn notes(
    meta: &Meta,
    collector: &Collector,
    losses: &Losses,
    stacks: &[StackReport],
    unnamed: &Unnamed,
    at_exit: &NotFreedAtExit,
) -> Vec<Note> {
    let mut notes: Vec<Note> = meta
        .allocators
        .iter()
        .map(|a| Note::AllocatorHooked { object: a.clone() })
        .collect();
    notes.extend(meta.scope_notes.iter().cloned());
    notes.extend(exit_notes(meta, at_exit));
    if unnamed.stacks > 0 {
        notes.push(Note::UnnamedStacks {
            stacks: unnamed.stacks,
            processes: unnamed.pids.len() as u64,
        });
    }
    if let Some(why) = &meta.session_error {
        notes.push(Note::NoUprobeSessions { why: why.clone() });
    }
    if let Some(why) = &meta.unwind_fallback {
        notes.push(Note::UnwindFallback {
            why: why.clone(),
            mode: meta.unwind.name().into(),
        });
    }
    if let crate::profile::Sampling::Bytes(rate) = meta.sampling {
        notes.push(Note::Sampled { rate });
    }
    notes.extend(super::event_notes::event_notes(meta, collector, losses));
    let (jit, unnamed_frames) = collector.jit_stats();
    if jit.refused + jit.capped + unnamed_frames > 0 {
        notes.push(Note::JitNamesIncomplete {
            refused_files: jit.refused,
            capped_entries: jit.capped,
            unnamed_frames,
        });
    }
    if let (objects @ 1.., Some(example)) = collector.refused_debug_links() {
        notes.push(Note::DebugLinksRefused { objects, example });
    }
    let code = collector.code_stats();
    if code.replaced + code.beyond_history > 0 {
        notes.push(Note::CodeReplaced {
            replaced: code.replaced,
            beyond_history: code.beyond_history,
        });
    }
    match meta.unwind {
        UnwindMode::Fp => notes.push(Note::FramePointerStacks),
        UnwindMode::Dwarf => {
            let cut = (stacks.iter().filter(|s| s.truncated).count() as u64)
                .saturating_sub(unnamed.truncated);
            if cut > 0 {
                notes.push(Note::StacksCut {
                    stacks: cut,
                    stack_bytes: meta.stack_bytes,
                });
            }
        }
        UnwindMode::Tables => {
            let cut = (stacks.iter().filter(|s| s.truncated).count() as u64)
                .saturating_sub(unnamed.truncated);
            let kernel = meta.kernel_unwind.unwrap_or_default();
            notes.extend(kernel.notes(cut, meta.stack_bytes));
        }
    }
    notes
}

/// Processes that exited during the trace: the one whose exit ended it
/// keeps its blocks in in-use; the others' are "not freed at exit".
fn exit_notes(meta: &Meta, at_exit: &NotFreedAtExit) -> Vec<Note> {
    let mut notes = Vec::new();
    let root = meta
        .processes
        .first()
        .filter(|p| p.exited && meta.root_exit_kept);
    if let Some(p) = root {
        notes.push(Note::RootExited {
            pid: p.pid,
            status: p.exit_status.clone(),
        });
    }
    // A folded group stands for the processes folded into it.
    let exited = meta
        .processes
        .iter()
        .filter(|p| p.exited)
        .map(|p| p.folded.max(1))
        .sum::<u64>()
        - u64::from(root.is_some());
    if exited > 0 {
        notes.push(Note::ProcessesExited {
            processes: exited,
            unfreed: at_exit.processes,
            bytes: at_exit.bytes,
            objects: at_exit.objects,
        });
    }
    notes
}
