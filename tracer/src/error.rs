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
    #[error("pid 0 is not a process (it names the kernel's idle task): pass the pid of a user process, see `ps -e`")]
    PidZero,
    #[error("pid {0} is memtrace-bpf itself, whose allocations would trace its own tracing: pass the pid of another process")]
    SelfPid(u32),
    #[error("pid {0} has exited (a zombie that its parent has not reaped): it has no memory left to trace")]
    Zombie(u32),
    #[error("cannot read /proc/{pid}/{what} ({reason}): inspecting another user's process needs CAP_SYS_PTRACE; run memtrace-bpf as root, or grant it with `setcap cap_sys_admin,cap_sys_ptrace+ep memtrace-bpf`")]
    Unreadable {
        pid: u32,
        what: String,
        reason: String,
    },
    #[error(
        "pid {0} is a kernel thread, which has no user-space heap: pass the pid of a user process"
    )]
    KernelThread(u32),
    #[error("{exe}: no object it loads defines malloc and free (it is probably statically linked and stripped): trace a dynamically linked program, or name the allocator's file with --allocator PATH")]
    NoAllocator { exe: String },
    #[error("{exe} is a {machine} program: memtrace-bpf traces 64-bit x86-64 programs only")]
    NotX86_64 { exe: String, machine: String },
    #[error("{exe} is statically linked and defines no malloc or free: it manages its memory with its own allocator (as Go programs do), which memtrace-bpf cannot hook; it traces programs that allocate through malloc")]
    OwnAllocator { exe: String },
    #[error("--allocator {allocator}: {exe} loads no such allocator (objects with allocator functions: {objects}); pass {choices}")]
    AllocatorNotFound {
        allocator: String,
        /// `AllocatorKind::choices()`.
        choices: String,
        exe: String,
        objects: String,
    },
    #[error("{path} does not define {symbol}: it is not a usable allocator (pass another with --allocator)")]
    MissingRequired { path: String, symbol: &'static str },
    #[error("{0} is statically linked and stripped: its allocator has no symbol to hook; trace a dynamically linked build, or one that keeps its symbol table")]
    StaticCommand(String),
    #[error("process {0} exited before the probes were attached: nothing was traced")]
    ExitedBeforeAttach(u32),
    #[error("stopped by {name} while loading the BPF programs: nothing was attached or traced")]
    InterruptedWhileLoading { name: &'static str, signal: i32 },
}
