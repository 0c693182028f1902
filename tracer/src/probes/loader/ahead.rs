//! Programs loaded ahead of their trace. The agent keeps a tracer process
//! whose programs are verified and loaded, attached nowhere and reading
//! their settings from the SETTINGS map; when a trace is asked for, that
//! process is given its command line, and `load` hands the programs over
//! with the trace's settings written into the map: the trace starts
//! without waiting for the verifier.
//!
//! One set of programs is held at a time, by the process that loaded it,
//! and it is freed with that process or handed to its one trace.

use std::sync::Mutex;

use anyhow::Context as _;

use super::loaded::{EventMaps, Loaded};
use crate::probes::{kernel_features::KernelFeatures, object_maps, Limits};

struct Ahead {
    loaded: Loaded,
    maps: EventMaps,
    limits: Limits,
}

// SAFETY: as `session::loading::Handover`: what is not Send are raw
// pointers to memory the loaded maps own, which move with their owner.
unsafe impl Send for Ahead {}

static AHEAD: Mutex<Option<Ahead>> = Mutex::new(None);

/// Loads the programs for traces of `limits`' sizes and unwinding, with
/// their settings in the SETTINGS map, and keeps them for the next `load`.
pub fn load_ahead(limits: &Limits, features: &KernelFeatures) -> anyhow::Result<()> {
    // Following forks needs the task's offsets from the kernel's BTF: a
    // load that could not follow them fails here, not in a trace.
    let limits = Limits {
        settings_in_map: true,
        follow_forks: true,
        ..*limits
    };
    let (mut loaded, maps) = super::load::load(&limits, features, false)?;
    // A trace that loads its own programs might get the mode asked for
    // where these, with more to verify, fell back: they are not kept.
    if let Some(why) = loaded.fallback() {
        anyhow::bail!(
            "the programs loaded ahead were refused in the unwind mode asked for ({why}): each \
             trace loads its own"
        );
    }
    // Their session copies too, verified apart: a failure leaves none,
    // and is met again, and said, when the trace attaches.
    if features.uprobe_session {
        let _ = super::attach::load_session_programs(&mut loaded);
    }
    *AHEAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(Ahead {
        loaded,
        maps,
        limits,
    });
    Ok(())
}

/// The programs loaded ahead, given the trace of `limits`, when they serve
/// it; None when there are none or they were loaded for other sizes (then
/// they are freed, and the trace loads its own).
pub(super) fn take_for(limits: &Limits) -> anyhow::Result<Option<(Loaded, EventMaps)>> {
    let Some(ahead) = AHEAD.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return Ok(None);
    };
    if !ahead.limits.serves(limits) {
        crate::console::say(format_args!(
            "the programs loaded ahead were loaded for other sizes or unwinding than this \
             trace's: loading the trace's own"
        ));
        return Ok(None);
    }
    let Ahead {
        mut loaded, maps, ..
    } = ahead;
    give(&mut loaded, limits)?;
    loaded.loaded_ahead = true;
    Ok(Some((loaded, maps)))
}

/// Writes the trace's settings, seeds the sampling countdowns for its rate,
/// sets the traced cgroup, then attaches the tracepoints.
fn give(loaded: &mut Loaded, limits: &Limits) -> anyhow::Result<()> {
    let ebpf = loaded
        .ebpf
        .as_mut()
        .context("the programs loaded ahead were already detached")?;
    let table = crate::model::sampling::exp_table();
    object_maps::seed_countdowns(ebpf, limits.sampling.rate(), &table)?;
    loaded
        .cgroup
        .set(0, limits.cgroup.id, 0)
        .context("setting the traced cgroup")?;
    object_maps::settings_map(ebpf)?
        .set(0, limits.trace_settings(), 0)
        .context("writing the trace's settings")?;
    loaded.code_gen = super::kernel_programs::arm(ebpf)?;
    Ok(())
}
