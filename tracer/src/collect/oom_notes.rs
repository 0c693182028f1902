//! What the profile says per process about OOM kills and temporary
//! allocations: the victims' time and heap, each process's temporaries.

use std::collections::HashMap;

use crate::{
    collect::{meta::Meta, oom::secs_into_trace, state::State},
    profile::{OomKilled, StackReport, Temporary},
};

/// Fills `meta.processes`' `oom_killed` and `temporary`; returns the
/// temporaries of every stack (None when sampling). `now_ns` is now on the
/// events' clock, read with `meta.started.elapsed()`.
pub(super) fn fill_processes(
    meta: &mut Meta,
    state: &State,
    stacks: &[StackReport],
    now_ns: u64,
) -> Option<Temporary> {
    let since_start = meta.started.elapsed().as_secs_f64();
    for victim in state.oom().victims() {
        let Some(record) = state.processes().get(victim.process) else {
            continue;
        };
        let Some(p) = meta
            .processes
            .iter_mut()
            .find(|p| p.pid == victim.pid && p.start_time == record.start_time && p.folded == 0)
        else {
            continue;
        };
        // Still dying (its exit not handled yet): its heap now.
        let heap = victim
            .heap
            .unwrap_or_else(|| state.heap().inuse_of(victim.pid));
        p.oom_killed = Some(OomKilled {
            secs: secs_into_trace(victim.at_ns, now_ns, since_start),
            inuse_bytes: heap.bytes,
            inuse_objects: heap.objects,
        });
    }
    state.temporaries().as_ref()?;
    // A folded group is pid 0 and its program.
    type Key<'a> = (u32, Option<u64>, Option<&'a str>);
    let mut per_process: HashMap<Key<'_>, Temporary> = HashMap::new();
    let mut total = Temporary::default();
    for s in stacks {
        let t = s.temporary.unwrap_or_default();
        total.add(t);
        let key = (s.pid, s.start_time, s.exited_group.as_deref());
        per_process.entry(key).or_default().add(t);
    }
    for p in &mut meta.processes {
        let group = (p.folded > 0).then_some(p.program.as_str());
        let key = (p.pid, p.start_time, group);
        p.temporary = Some(per_process.get(&key).copied().unwrap_or_default());
    }
    Some(total)
}
