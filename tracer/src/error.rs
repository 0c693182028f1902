//! Errors the user can act on. Each message is one sentence that says what to
//! do; `main` prints it and exits with status 1.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TraceError {
    #[error(
        "memtrace-bpf lacks {0}, which this kernel requires to open uprobes (CAP_BPF and CAP_PERFMON are not enough, whatever kernel.perf_event_paranoid says): run it as root, or grant it with `setcap cap_sys_admin+ep memtrace-bpf` (cap_sys_admin,cap_sys_ptrace+ep to trace other users' processes)"
    )]
    NotPrivileged(String),
    #[error("process {0} belongs to another user (or is not dumpable): reading its memory map needs CAP_SYS_PTRACE; run memtrace-bpf as root, or grant it with `setcap cap_sys_admin,cap_sys_ptrace+ep memtrace-bpf`")]
    NeedsSysPtrace(u32),
    #[error("this kernel has no uprobe support (no /sys/bus/event_source/devices/uprobe): a kernel built with CONFIG_UPROBE_EVENTS is needed")]
    NoUprobes,
    #[error("no process with pid {0}: check the pid with `ps -p {0}`")]
    NoSuchProcess(u32),
    #[error(
        "pid {0} is a kernel thread, which has no user-space heap: pass the pid of a user process"
    )]
    KernelThread(u32),
    #[error("{exe}: no object it loads defines malloc and free (it is probably statically linked and stripped): trace a dynamically linked program, or name the allocator's file with --allocator PATH")]
    NoAllocator { exe: String },
    #[error("--allocator {allocator}: {exe} loads no such allocator (objects with allocator functions: {objects}); pass auto, glibc, jemalloc, tcmalloc, mimalloc or the path of a loaded object")]
    AllocatorNotFound {
        allocator: String,
        exe: String,
        objects: String,
    },
    #[error("{path} does not define {symbol}: it is not a usable allocator (pass another with --allocator)")]
    MissingRequired { path: String, symbol: &'static str },
    #[error("{0} is statically linked and stripped: its allocator has no symbol to hook; trace a dynamically linked build, or one that keeps its symbol table")]
    StaticCommand(String),
    #[error("process {0} exited before the probes were attached: nothing was traced")]
    ExitedBeforeAttach(u32),
}
