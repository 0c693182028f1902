//! memtrace-bpf's BPF programs: uprobes and uretprobes on the allocator.
//!
//! Each `#[uprobe]` / `#[uretprobe]` entry point is one line that calls a
//! shared helper. Entry probes remember {size, pointer argument, record?} per
//! thread in INFLIGHT; return probes read the result, capture the user stack,
//! insert the block into LIVE and emit an ALLOC event; free emits a FREE event
//! only for addresses found in LIVE, so frees of unrecorded blocks cost one
//! hash lookup.
//!
//! The allocator programs are here; `args` (reading arguments), `alloc`
//! (entry and return), `free`, `sampling` and `stack` (capture) hold what
//! they share, `maps` the maps, the tunables and the helpers every program
//! uses, `process` the exec, fork and exit tracepoints and the `--binary`
//! entry-point probe.
// Built for real only for the BPF target; on the host (cargo clippy / test
// --workspace, where feature unification pulls in std through aya) it is an
// empty program, so the probe code is still type-checked and linted.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// BPF atomics (scratch.rs): core's atomic types have no read-modify-write
// for the BPF target, the intrinsics do.
#![cfg_attr(
    target_arch = "bpf",
    expect(
        internal_features,
        reason = "core::intrinsics' atomics, see scratch.rs"
    ),
    feature(core_intrinsics)
)]

mod alloc;
mod args;
mod code_gen;
mod free;
mod inflight;
mod maps;
mod process;
mod sampling;
mod scratch;
mod settings;
mod stack;
mod walk;
mod window;

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::Role;

use crate::{
    alloc::{on_alloc_enter, on_alloc_enter_max, on_alloc_return},
    args::Args,
    free::{on_free, BlockSizes},
};

/// An allocating function's entry program: `#[uprobe]` with the body's
/// value as the program's. aya-ebpf-macros 0.2's `#[uprobe]` wrapper
/// discards it and returns 0, and in session mode that value is the whole
/// point: the dispatcher tail-calls this program, so its return is the
/// session program's, and a non-zero one makes the kernel skip the return
/// run (`uprobe_multi_link_handler` → UPROBE_HANDLER_IGNORE). Attached as a
/// plain uprobe, it returns 0 (no_return_needed without CONTROL_SESSION).
macro_rules! entry_program {
    ($name:ident, |$ctx:ident| $body:block) => {
        #[unsafe(no_mangle)]
        #[unsafe(link_section = "uprobe")]
        pub fn $name(raw: *mut core::ffi::c_void) -> u32 {
            let $ctx = ProbeContext::new(raw);
            scratch::not_preempted(|| $body)
        }
    };
}

entry_program!(malloc_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Malloc, a.get(0), 0)
});

entry_program!(calloc_enter, |ctx| {
    let a = Args::of(&ctx);
    // An overflowing nmemb * size makes calloc fail; the return sees NULL.
    on_alloc_enter(&ctx, Role::Calloc, a.get(0).wrapping_mul(a.get(1)), 0)
});

entry_program!(realloc_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Realloc, a.get(1), a.get(0))
});

entry_program!(reallocarray_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(
        &ctx,
        Role::ReallocArray,
        a.get(1).wrapping_mul(a.get(2)),
        a.get(0),
    )
});

entry_program!(posix_memalign_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::PosixMemalign, a.get(2), a.get(0))
});

entry_program!(aligned_alloc_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::AlignedAlloc, a.get(1), 0)
});

entry_program!(memalign_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Memalign, a.get(1), 0)
});

entry_program!(valloc_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Valloc, a.get(0), 0)
});

entry_program!(pvalloc_enter, |ctx| {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Pvalloc, a.get(0), 0)
});

entry_program!(xallocx_enter, |ctx| {
    let a = Args::of(&ctx);
    let (ptr, size, extra) = (a.get(0), a.get(1), a.get(2));
    on_alloc_enter_max(&ctx, Role::Xallocx, size, size.saturating_add(extra), ptr)
});

/// One return program serves every allocating function: the role comes from
/// the in-flight entry.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    scratch::not_preempted(|| on_alloc_return(&ctx))
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    scratch::not_preempted(|| on_free(&ctx, BlockSizes::Unknown))
}

/// glibc's free: as `free_enter`, and the size of a block the trace never
/// saw allocated is read from its chunk header.
#[uprobe]
pub fn free_glibc_enter(ctx: ProbeContext) -> u32 {
    scratch::not_preempted(|| on_free(&ctx, BlockSizes::GlibcChunks))
}

/// Benchmark floors (`--noop-probes`): probes that do nothing, to measure
/// what the kernel charges for the probes alone.
#[uprobe]
pub fn noop_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
