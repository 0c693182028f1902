//! The trace's settings: its filter and its sample rate. A trace whose
//! programs are loaded for it has them as read-only globals, which the
//! verifier reads as constants (it prunes the branches of the other
//! filters and of the other of exact and sampled). Programs the agent
//! loads ahead of a trace (SETTINGS_IN_MAP) read them from the SETTINGS
//! map instead, written by user space when the trace is given to them.

use aya_ebpf::{macros::map, maps::Array};
use tracer_common::{TraceSettings, FILTER_NONE, FORKS_COUNT};

/// See tracer_common::FILTER_*; set at load time.
#[unsafe(no_mangle)]
pub(crate) static FILTER: u32 = FILTER_NONE;
/// FILTER_ALL: only threads with this name (NUL-padded), if not empty.
#[unsafe(no_mangle)]
pub(crate) static COMM: [u8; 16] = [0; 16];
/// FILTER_CGROUP: the depth of the traced subtree's root below the
/// hierarchy's root (0 = the root), and in CGROUP its cgroup v2 id (its
/// directory's inode). A task is traced when its own cgroup's ancestor at
/// that depth is this one: cgroups made under it during the trace, and
/// processes moved into it, are traced with no help from user space.
#[unsafe(no_mangle)]
pub(crate) static CGROUP_LEVEL: u32 = 0;
/// `--follow-forks` (FORKS_FOLLOW, with FILTER_PIDS): children of traced
/// processes join TRACED at fork. Otherwise (FORKS_COUNT) children of the
/// one traced process (FILTER_NONE) are only counted.
#[unsafe(no_mangle)]
pub(crate) static FOLLOW_FORKS: u32 = FORKS_COUNT;
/// Mean bytes between recorded allocations (`--sample-rate`); 1 records
/// every allocation (exact mode).
#[unsafe(no_mangle)]
pub(crate) static SAMPLE_RATE: u64 = 1;

/// 1: the settings are read from SETTINGS, not from the globals above.
#[unsafe(no_mangle)]
pub(crate) static SETTINGS_IN_MAP: u32 = 0;
/// 1 when the kernel offers bpf_get_current_ancestor_cgroup_id to uprobe
/// programs. With settings in the map FILTER_CGROUP is no constant, so
/// the helper's call would be verified on every kernel: 0 keeps it out.
#[unsafe(no_mangle)]
pub(crate) static CGROUP_HELPER: u32 = 1;

/// Index 0: the trace's settings when SETTINGS_IN_MAP (TraceSettings::IDLE,
/// which records nothing, until a trace is given to the programs).
#[map]
pub(crate) static SETTINGS: Array<TraceSettings> = Array::with_max_entries(1, 0);

#[inline(always)]
fn in_map() -> Option<&'static TraceSettings> {
    if tunable(&SETTINGS_IN_MAP) == 0 {
        return None;
    }
    SETTINGS.get(0)
}

#[inline(always)]
pub(crate) fn filter() -> u32 {
    if tunable(&SETTINGS_IN_MAP) != 0 {
        // An array's index 0 is always there; the pid-set filter with
        // nothing in it is what records nothing.
        return in_map().map_or(tracer_common::FILTER_PIDS, |s| s.filter);
    }
    tunable(&FILTER)
}

#[inline(always)]
pub(crate) fn comm() -> [u8; 16] {
    match in_map() {
        Some(s) => s.comm,
        None => tunable(&COMM),
    }
}

#[inline(always)]
pub(crate) fn cgroup_level() -> u32 {
    match in_map() {
        Some(s) => s.cgroup_level,
        None => tunable(&CGROUP_LEVEL),
    }
}

#[inline(always)]
pub(crate) fn follow_forks() -> u32 {
    match in_map() {
        Some(s) => s.follow_forks,
        None => tunable(&FOLLOW_FORKS),
    }
}

#[inline(always)]
pub(crate) fn sample_rate() -> u64 {
    match in_map() {
        Some(s) => s.sample_rate,
        None => tunable(&SAMPLE_RATE),
    }
}

#[inline(always)]
pub(crate) fn cgroup_helper() -> bool {
    tunable(&CGROUP_HELPER) != 0
}

/// Reads a tunable (a read-only global the loader sets, or an element of
/// one) of any type.
#[inline(always)]
pub(crate) fn tunable<T: Copy>(value: &T) -> T {
    // SAFETY: a plain read of a global; volatile so the compiler does not
    // fold in the default, since the loader rewrites it before loading.
    unsafe { core::ptr::read_volatile(value) }
}
