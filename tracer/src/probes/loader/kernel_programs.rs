//! The programs attached to the kernel rather than to a traced file: the
//! raw tracepoints of processes' lives, and the code-generation hook.

use anyhow::Context as _;
use aya::{programs::RawTracePoint, Ebpf};
use tracer_common::names::program;

/// The raw tracepoint programs and their tracepoints: exec, fork, exit of
/// traced processes; signal_deliver marks a thread's allocator call
/// interrupted, so a handler's calls are recorded (tracer-ebpf inflight.rs);
/// mark_victim reports a traced process the OOM killer chose.
pub(super) const TRACEPOINTS: [(&str, &str); 5] = [
    (program::PROCESS_EXEC, "sched_process_exec"),
    (program::PROCESS_FORK, "sched_process_fork"),
    (program::PROCESS_EXIT, "sched_process_exit"),
    (program::SIGNAL_DELIVER, "signal_deliver"),
    (program::OOM_MARK_VICTIM, "mark_victim"),
];

/// The fexit program that bumps a process's code generation when it maps
/// a file executable (tracer-ebpf code_gen.rs), and its kernel function;
/// where the kernel refuses fexit programs, the raw tracepoint program
/// that does the same at every system call's exit.
pub(super) const CODE_GEN_PROGRAM: &str = program::MAPS_CHANGE;
const CODE_GEN_FUNCTION: &str = "vm_mmap_pgoff";
pub(super) const CODE_GEN_SYSCALL_PROGRAM: &str = program::MAPS_CHANGE_SYSCALL;
const CODE_GEN_TRACEPOINT: &str = "sys_exit";

/// Attaches the programs that run for every process of the host (its
/// processes' lives, the code-generation hook): how code generations are
/// kept, as `Loaded::code_gen`.
pub(super) fn arm(ebpf: &mut Ebpf) -> anyhow::Result<Result<(bool, Option<String>), String>> {
    for (program, tracepoint) in TRACEPOINTS {
        attach_tracepoint(ebpf, program, tracepoint)?;
    }
    Ok(attach_code_gen(ebpf))
}

/// Loads and attaches a code-generation program: the fexit one, else the
/// sys_exit one. An error leaves the trace without generations (said
/// with --verbose), never fails it.
pub(super) fn attach_code_gen(ebpf: &mut Ebpf) -> Result<(bool, Option<String>), String> {
    let fexit = match attach_code_gen_fexit(ebpf) {
        Ok(()) => return Ok((true, None)),
        Err(e) => format!("{e:#}"),
    };
    match load_and_attach_tracepoint(ebpf, CODE_GEN_SYSCALL_PROGRAM, CODE_GEN_TRACEPOINT) {
        Ok(()) => Ok((false, Some(fexit))),
        Err(e) => Err(format!("{fexit}; {e:#}")),
    }
}

fn load_and_attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &str,
    tracepoint: &str,
) -> anyhow::Result<()> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?;
    prog.load()
        .with_context(|| format!("loading BPF program {program}"))?;
    attach_tracepoint(ebpf, program, tracepoint)
}

fn attach_code_gen_fexit(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let prog: &mut aya::programs::FExit = ebpf
        .program_mut(CODE_GEN_PROGRAM)
        .with_context(|| format!("BPF object has no program {CODE_GEN_PROGRAM}"))?
        .try_into()?;
    prog.load(CODE_GEN_FUNCTION, &btf)
        .with_context(|| format!("loading an fexit program of {CODE_GEN_FUNCTION}"))?;
    prog.attach()
        .with_context(|| format!("attaching an fexit program to {CODE_GEN_FUNCTION}"))?;
    Ok(())
}

pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &str,
    tracepoint: &str,
) -> anyhow::Result<()> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?;
    prog.attach(tracepoint)
        .with_context(|| format!("attaching to the {tracepoint} tracepoint"))?;
    Ok(())
}
