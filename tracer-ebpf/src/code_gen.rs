//! Which code a traced process has mapped, as a generation number the
//! kernel keeps and each stack carries, so that user space names a frame
//! from the file that was mapped when the walk ran, not from whatever is
//! mapped there when it reads the maps (a plugin unloaded and another
//! loaded at its address, docs/unwind-tables.md).
//!
//! MAPS_READ holds, per process whose maps user space has read, the
//! generation they were read at (written by user space). From then on,
//! every `mmap` of a file with PROT_EXEC by that process bumps its
//! generation in MAPS_GEN (an fexit program; where the kernel refuses
//! it, a raw tracepoint on every system call's exit) and is remembered
//! there with its range (the
//! last CODE_HISTORY of them): a frame of a stack taken at generation g
//! is named from the maps read at generation r only if no code was mapped
//! over its address in between. A walk under another generation than the
//! one the maps were read at does not trust the tables user space
//! described: it sends the stack from the leaf for user space to unwind
//! after it has read the maps again.
//!
//! A traced process that execs gets a MAPS_READ entry of 0 at once, so
//! that its mappings count before user space reads its maps. Both maps
//! hold at most MAPS_GEN_ENTRIES processes; an entry goes at the process's
//! exit and exec (process.rs), and when user space drops a process. A process without a MAPS_READ entry (the map was
//! full) keeps generation 0, as before this existed.

use aya_ebpf::{
    bindings::{pt_regs, BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{fexit, map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::{FExitContext, RawTracePointContext},
};
use tracer_common::{CodeMaps, CodeRange, CODE_HISTORY};

/// Entries of MAPS_GEN and MAPS_READ (processes).
const MAPS_GEN_ENTRIES: u32 = 1 << 16;

/// Per process: its code generation and last executable mappings.
#[map]
pub(crate) static MAPS_GEN: HashMap<u32, CodeMaps> =
    HashMap::with_max_entries(MAPS_GEN_ENTRIES, BPF_F_NO_PREALLOC);
/// Per process: the generation user space last read its maps at.
#[map]
pub(crate) static MAPS_READ: HashMap<u32, u32> =
    HashMap::with_max_entries(MAPS_GEN_ENTRIES, BPF_F_NO_PREALLOC);
/// An empty CodeMaps, never written: the value a new MAPS_GEN entry is
/// made from (larger than the BPF stack).
#[map]
static EMPTY_CODE_MAPS: PerCpuArray<CodeMaps> = PerCpuArray::with_max_entries(1, 0);

/// mmap's bits, and x86_64's mmap system call number.
const PROT_EXEC: u64 = 4;
const MAP_ANONYMOUS: u64 = 0x20;
const NR_MMAP: u64 = 9;
/// Return values from -4095 to -1 are errors.
const MAX_ERRNO: u64 = 4095;

/// fexit of vm_mmap_pgoff(file, addr, len, prot, flag, pgoff), which every
/// mmap system call goes through: a file mapped executable by a process
/// whose maps user space read. Runs on mmap calls only, so other system
/// calls cost nothing (a raw_syscalls tracepoint would put every system
/// call of the host on the kernel's slow path). Arguments and the return
/// value are read from the context by position.
#[fexit(function = "vm_mmap_pgoff")]
pub fn maps_change(ctx: FExitContext) -> i32 {
    let file: u64 = ctx.arg(0);
    let len: u64 = ctx.arg(2);
    let prot: u64 = ctx.arg(3);
    let ret: u64 = ctx.arg(6);
    if file != 0 && prot & PROT_EXEC != 0 && ret < MAX_ERRNO.wrapping_neg() {
        on_exec_mapping(ret, len);
    }
    0
}

/// raw_syscalls:sys_exit (args: the caller's pt_regs, the return value),
/// where fexit programs cannot be loaded: the same for an mmap system
/// call, whose number and arguments the registers still hold. It runs at
/// every system call's exit, and its being attached puts every system
/// call of the host on the kernel's slow path (docs/unwind-tables.md).
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn maps_change_syscall(ctx: RawTracePointContext) -> i32 {
    let regs = ctx.arg::<u64>(0) as *const pt_regs;
    let ret = ctx.arg::<u64>(1);
    // SAFETY: the helper reads kernel memory and fails safely; `regs` is
    // the calling task's saved user registers, as the tracepoint passes.
    let nr = unsafe { bpf_probe_read_kernel(&(*regs).orig_rax) }.unwrap_or(u64::MAX);
    if nr != NR_MMAP || ret >= MAX_ERRNO.wrapping_neg() {
        return 0;
    }
    // SAFETY: as above.
    let (len, prot, flags, fd) = unsafe {
        (
            bpf_probe_read_kernel(&(*regs).rsi).unwrap_or(0),
            bpf_probe_read_kernel(&(*regs).rdx).unwrap_or(0),
            bpf_probe_read_kernel(&(*regs).r10).unwrap_or(MAP_ANONYMOUS),
            bpf_probe_read_kernel(&(*regs).r8).unwrap_or(u64::MAX),
        )
    };
    // An anonymous mapping, or fd -1 (a negative int in the low half).
    if prot & PROT_EXEC != 0 && flags & MAP_ANONYMOUS == 0 && i32::try_from(fd as u32).is_ok() {
        on_exec_mapping(ret, len);
    }
    0
}

#[inline(always)]
fn on_exec_mapping(start: u64, len: u64) {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a u32 value, read once.
    let Some(read) = (unsafe { MAPS_READ.get(pid) }).copied() else {
        return;
    };
    let maps = match MAPS_GEN.get_ptr_mut(pid) {
        Some(maps) => maps,
        None => {
            let Some(empty) = EMPTY_CODE_MAPS.get_ptr(0) else {
                return;
            };
            // SAFETY: a map value of the right type, copied by the helper.
            // By reference: a CodeMaps by value would not fit the BPF stack.
            #[expect(clippy::needless_borrows_for_generic_args, reason = "see above")]
            let _ = MAPS_GEN.insert(pid, unsafe { &*empty }, u64::from(BPF_NOEXIST));
            let Some(maps) = MAPS_GEN.get_ptr_mut(pid) else {
                return;
            };
            // SAFETY: this map's value.
            unsafe { (*maps).gen = read };
            maps
        }
    };
    // SAFETY: this map's value. Two threads mapping at once may both
    // write the same next generation: it still changes, which is what
    // readers compare, and both ranges are as new as it.
    unsafe {
        let gen = (*maps).gen.wrapping_add(1).max(1);
        (*maps).ranges[gen as usize % CODE_HISTORY] = CodeRange {
            start,
            len: len.min(u64::from(u32::MAX)) as u32,
            gen,
        };
        (*maps).gen = gen;
    }
}

/// Process `pid`'s code generation now, and whether it differs from the
/// one user space read its maps at (the tables it described may be of
/// code unmapped since).
#[inline(always)]
pub(crate) fn code_gen(pid: u32) -> (u32, bool) {
    // SAFETY: a map value, read once.
    let Some(gen) = unsafe { MAPS_GEN.get(pid) }.map(|m| m.gen) else {
        return (0, false);
    };
    // SAFETY: as above.
    let read = unsafe { MAPS_READ.get(pid) }.copied();
    (gen, read != Some(gen))
}

/// A traced process exec'ed: its generations count from 0, as if user
/// space had read its maps before the new image mapped anything.
#[inline(always)]
pub(crate) fn track_from_exec(pid: u32) {
    let _ = MAPS_READ.insert(pid, 0, 0);
}

/// The process exited or exec'ed: its maps are to be read anew.
#[inline(always)]
pub(crate) fn forget(pid: u32) {
    let _ = MAPS_GEN.remove(pid);
    let _ = MAPS_READ.remove(pid);
}
