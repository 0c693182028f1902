//! The per-CPU scratch buffers' slots (walk state, stack window, event
//! buffers). Uprobe programs run with migration disabled but, on a
//! preemptible kernel (PREEMPT_LAZY is Debian's default from 7.x), may be
//! preempted, and another task's program then runs on the same CPU and,
//! with a buffer of one slot, overwrites a walk or an event half-built.
//!
//! Where the verifier takes BPF atomics (5.12+, `ATOMIC_SLOTS`), a program
//! takes a free slot with an atomic fetch-or on the CPU's busy mask and
//! gives it back when it is done (`Drop`): programs interleaved on a CPU
//! never share a slot, and when all are taken the stack is counted lost.
//! Older kernels (whose distribution builds are not preemptible) use the
//! slot of the thread id's low bits; the walk still checks it kept its
//! slot (walk.rs).

use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::map, maps::PerCpuArray};

use tracer_common::StackSample;

use crate::maps::tunable;

unsafe extern "C" {
    /// Kfuncs (6.10+). bpf-linker leaves each call as a call of an
    /// undefined symbol; the loader turns it into a kfunc call, or into
    /// `r0 = 0` on kernels without them (probes/object_patch.rs).
    fn bpf_preempt_disable();
    fn bpf_preempt_enable();
}

/// Runs a uprobe program's body with preemption disabled. Uprobe programs
/// are of the kprobe type, which kernels from 6.13 give a per-CPU private
/// stack when their frames are large, on the assumption that they cannot
/// be preempted; on a preemptible kernel they can, and a program of
/// another task then runs on that same stack and corrupts the first one's
/// frames (a kernel oops, seen on Debian's 7.2). With preemption disabled
/// for the whole run, nothing else runs on this CPU's private stack or
/// scratch buffers meanwhile.
#[inline(always)]
pub(crate) fn not_preempted(body: impl FnOnce() -> u32) -> u32 {
    // SAFETY: kfuncs without arguments; every disable is paired with the
    // enable below (the verifier checks the balance on every path).
    unsafe { bpf_preempt_disable() };
    let ret = body();
    // SAFETY: as above.
    unsafe { bpf_preempt_enable() };
    ret
}

/// Slots of each per-CPU scratch map.
pub(crate) const SCRATCH_SLOTS: u32 = 4;

/// Per-CPU buffer where a DWARF-mode sample is assembled before it is
/// copied into the ring buffer with its real length (a reservation must
/// have a fixed size); one per slot.
#[map]
pub(crate) static SAMPLE_BUF: PerCpuArray<StackSample> =
    PerCpuArray::with_max_entries(SCRATCH_SLOTS, 0);

/// Per CPU, bit i set while a program holds slot i (with ATOMIC_SLOTS).
#[map]
static SCRATCH_BUSY: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// 1 when the kernel's verifier takes atomic fetch operations; set at
/// load time from a probe (probes/kernel_features.rs).
#[unsafe(no_mangle)]
static ATOMIC_SLOTS: u32 = 0;

/// A scratch slot held by the running program.
pub(crate) struct Scratch {
    pub(crate) slot: u32,
    /// The CPU's busy mask, when the slot was taken with an atomic.
    busy: Option<*mut u64>,
}

impl Scratch {
    /// A slot of this CPU's scratch maps; None when every slot is held by
    /// programs this one interrupted or preempted.
    #[inline(always)]
    pub(crate) fn take() -> Option<Scratch> {
        if tunable(&ATOMIC_SLOTS) == 0 {
            let slot = (bpf_get_current_pid_tgid() as u32) & (SCRATCH_SLOTS - 1);
            return Some(Scratch { slot, busy: None });
        }
        let busy = SCRATCH_BUSY.get_ptr_mut(0)?;
        // The lowest free slot of a snapshot of the mask, then taken with
        // one atomic fetch-or; a program that took it in between makes
        // this one go without (counted by the caller). Computed, not found
        // by a loop over the slots: the verifier would check the rest of
        // the program once per slot number.
        // SAFETY: as below; a plain read of the mask.
        let snapshot = unsafe { core::ptr::read_volatile(busy) };
        let free = !snapshot & snapshot.wrapping_add(1);
        if free >= 1 << SCRATCH_SLOTS {
            return None;
        }
        // SAFETY: a u64 of a per-CPU array value, aligned, that every
        // program on this CPU changes only through atomics.
        let before = unsafe { fetch_or(busy, free) };
        if before & free != 0 {
            return None;
        }
        // log2 of a single bit below 1 << 4.
        let slot = (((free >> 1) & 1) + ((free >> 2) & 1) * 2 + ((free >> 3) & 1) * 3) as u32;
        Some(Scratch {
            slot: slot & (SCRATCH_SLOTS - 1),
            busy: Some(busy),
        })
    }
}

impl Drop for Scratch {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(busy) = self.busy {
            // SAFETY: as in `take`.
            unsafe { fetch_and(busy, !(1u64 << self.slot)) };
        }
    }
}

/// Atomic `*p |= v`, returning the old value: BPF's atomic fetch-or. core's
/// AtomicU64 has no read-modify-write for the BPF target; the intrinsic
/// has. (On the host, where this crate is only type-checked, AtomicU64.)
///
/// # Safety
/// `p` points to a live, aligned u64 changed only through atomics.
#[inline(always)]
unsafe fn fetch_or(p: *mut u64, v: u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_or::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, v)
    }
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as the caller promises.
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_or(v, core::sync::atomic::Ordering::Relaxed)
    }
}

/// Atomic `*p &= v`, as `fetch_or`.
///
/// # Safety
/// As `fetch_or`.
#[inline(always)]
unsafe fn fetch_and(p: *mut u64, v: u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    // SAFETY: as the caller promises.
    unsafe {
        core::intrinsics::atomic_and::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            p, v,
        )
    }
    #[cfg(not(target_arch = "bpf"))]
    // SAFETY: as the caller promises.
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(p)
            .fetch_and(v, core::sync::atomic::Ordering::Relaxed)
    }
}
