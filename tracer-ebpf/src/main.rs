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

mod alloc;
mod args;
mod free;
mod inflight;
mod maps;
mod process;
mod sampling;
mod stack;
mod walk;

use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::Role;

use crate::{
    alloc::{on_alloc_enter, on_alloc_enter_max, on_alloc_return},
    args::Args,
    free::on_free,
};

#[uprobe]
pub fn malloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Malloc, a.get(0), 0)
}

#[uprobe]
pub fn calloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    // An overflowing nmemb * size makes calloc fail; the return sees NULL.
    on_alloc_enter(&ctx, Role::Calloc, a.get(0).wrapping_mul(a.get(1)), 0)
}

#[uprobe]
pub fn realloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Realloc, a.get(1), a.get(0))
}

#[uprobe]
pub fn reallocarray_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(
        &ctx,
        Role::ReallocArray,
        a.get(1).wrapping_mul(a.get(2)),
        a.get(0),
    )
}

#[uprobe]
pub fn posix_memalign_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::PosixMemalign, a.get(2), a.get(0))
}

#[uprobe]
pub fn aligned_alloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::AlignedAlloc, a.get(1), 0)
}

#[uprobe]
pub fn memalign_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Memalign, a.get(1), 0)
}

#[uprobe]
pub fn valloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Valloc, a.get(0), 0)
}

#[uprobe]
pub fn pvalloc_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    on_alloc_enter(&ctx, Role::Pvalloc, a.get(0), 0)
}

#[uprobe]
pub fn xallocx_enter(ctx: ProbeContext) -> u32 {
    let a = Args::of(&ctx);
    let (ptr, size, extra) = (a.get(0), a.get(1), a.get(2));
    on_alloc_enter_max(&ctx, Role::Xallocx, size, size.saturating_add(extra), ptr)
}

/// One return program serves every allocating function: the role comes from
/// the in-flight entry.
#[uretprobe]
pub fn alloc_return(ctx: RetProbeContext) -> u32 {
    on_alloc_return(&ctx)
}

#[uprobe]
pub fn free_enter(ctx: ProbeContext) -> u32 {
    on_free(&ctx)
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
