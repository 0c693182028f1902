//! `--sample-rate`: which calls are recorded.

use tracer_common::{EXP_TABLE_LEN, EXP_TABLE_SHIFT};

use crate::{
    maps::{tunable, COUNTDOWN, EXP_TABLE},
    settings::sample_rate,
};

#[inline(always)]
pub(crate) fn sampling() -> bool {
    sample_rate() > 1
}

/// The "record this call or not" decision: every call in exact mode;
/// otherwise when the per-CPU byte countdown crosses zero, after which the
/// next countdown is drawn from an exponential distribution with mean R.
#[inline(always)]
pub(crate) fn should_record(size: u64) -> bool {
    let rate = sample_rate();
    if rate <= 1 {
        return true;
    }
    let Some(left) = COUNTDOWN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot. A task preempted between these lines lets
    // another one on this CPU update it too: a skewed draw, not a fault.
    unsafe {
        *left -= size as i64;
        if *left > 0 {
            return false;
        }
        *left = next_interval(rate) as i64;
    }
    true
}

#[inline(always)]
fn next_interval(rate: u64) -> u64 {
    // SAFETY: helper without preconditions.
    let i = unsafe { aya_ebpf::helpers::generated::bpf_get_prandom_u32() } as usize % EXP_TABLE_LEN;
    let e = tunable(&EXP_TABLE[i]) as u64;
    ((e * rate) >> EXP_TABLE_SHIFT).max(1)
}
