//! The notes at the end of a profile: what was hooked, what the scope and
//! the processes' exits mean for the numbers, what was lost, and why stacks
//! end early.

use crate::{
    collect::{
        collector::Collector,
        profile::{Meta, Unnamed},
    },
    probes::UnwindMode,
    report::{counted, Losses, NotFreedAtExit, StackReport},
};

pub(super) fn notes(
    meta: &Meta,
    collector: &Collector,
    losses: &Losses,
    stacks: &[StackReport],
    unnamed: &Unnamed,
    at_exit: &NotFreedAtExit,
) -> Vec<String> {
    let mut notes: Vec<String> = meta
        .allocators
        .iter()
        .map(|a| format!("allocator hooked: {a}"))
        .collect();
    notes.extend(meta.scope_notes.iter().cloned());
    notes.extend(exit_notes(meta, at_exit));
    if unnamed.stacks > 0 {
        notes.push(format!(
            "{} stacks of {} processes have frames shown as [unknown] address: the processes \
             exited or called exec before the tracer could read their memory \
             maps (that image lived a few milliseconds); a command started by memtrace-bpf is \
             held at its exit and keeps them",
            unnamed.stacks,
            unnamed.pids.len()
        ));
    }
    if let Some(why) = &meta.session_error {
        notes.push(format!(
            "uprobe sessions unavailable ({why}): every call also pays a return probe"
        ));
    }
    if meta.sample_rate > 1 {
        notes.push(format!(
            "sampled: one allocation recorded per {} bytes allocated on average, each weighted \
             by 1/(1-e^(-size/{})); the numbers are estimates (--sample-rate 1 for exact ones)",
            meta.sample_rate, meta.sample_rate
        ));
    }
    notes.extend(super::event_notes::event_notes(meta, collector, losses));
    match meta.unwind {
        UnwindMode::Fp => notes.push(
            "stacks are frame-pointer walks: code built without frame pointers shows short stacks \
             (--unwind dwarf gives complete ones)"
                .into(),
        ),
        UnwindMode::Dwarf => {
            let cut = (stacks.iter().filter(|s| s.truncated).count() as u64)
                .saturating_sub(unnamed.truncated);
            if cut > 0 {
                let cut = match cut {
                    1 => "1 stack ends early".to_string(),
                    n => format!("{n} stacks end early"),
                };
                notes.push(truncation_note(&cut, meta.stack_bytes));
            }
        }
    }
    notes
}

/// Processes that exited during the trace: the one whose exit ended it
/// keeps its blocks in in-use; the others' are "not freed at exit".
fn exit_notes(meta: &Meta, at_exit: &NotFreedAtExit) -> Vec<String> {
    let mut notes = Vec::new();
    let root = meta
        .processes
        .first()
        .filter(|p| p.exited && meta.root_exit_kept);
    if let Some(p) = root {
        notes.push(format!(
            "process {} {} during the trace: in-use numbers are what it had not freed when it \
             exited",
            p.pid,
            p.exit_status.as_deref().unwrap_or("exited")
        ));
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
        let unfreed = match at_exit.processes {
            0 => "none left blocks unfreed".to_string(),
            n => format!(
                "{} of them left {} in {} unfreed, shown under \"not freed at exit\" \
                 (not in-use: no live process holds it)",
                n,
                counted(at_exit.bytes, "byte", "bytes"),
                counted(at_exit.objects, "object", "objects"),
            ),
        };
        notes.push(format!(
            "{} exited during the trace; {unfreed}",
            counted(exited, "process", "processes"),
        ));
    }
    notes
}

/// Why `cut` ("3 stacks end early") happened, and what to do: a larger
/// window only while one can be asked for.
fn truncation_note(cut: &str, stack_bytes: u32) -> String {
    let max = tracer_common::MAX_STACK_BYTES;
    let remedy = if (stack_bytes as usize) < max {
        format!("raise --stack-bytes, up to {max}")
    } else {
        format!(
            "{max}, the most --stack-bytes allows; for a program built with frame pointers, \
             --unwind fp walks stacks of any depth"
        )
    };
    format!(
        "{cut}, marked [truncated]: deeper than the {stack_bytes} bytes copied ({remedy}) or \
         through code without unwind information"
    )
}

#[cfg(test)]
mod tests {
    use super::truncation_note;

    #[test]
    fn a_larger_window_is_suggested_only_below_the_largest() {
        let max = tracer_common::MAX_STACK_BYTES as u32;
        let below = truncation_note("1 stack ends early", max / 2);
        assert!(
            below.contains(&format!("raise --stack-bytes, up to {max}")),
            "{below}"
        );
        let at_max = truncation_note("1 stack ends early", max);
        assert!(!at_max.contains("raise --stack-bytes"), "{at_max}");
        assert!(at_max.contains("--unwind fp"), "{at_max}");
    }
}
