//! What is traced: one process, a command started by memtrace-bpf, every
//! process running a program file, or every process on the machine.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use tracer_common::{FILTER_ALL, FILTER_NONE, FILTER_PIDS};

use crate::{
    cli::Cli,
    collect::processes::ProcessTable,
    error::TraceError,
    escape,
    probes::hooks::Hooks,
    probes::loader::Loaded,
    report::ProcessInfo,
    session::forks::{Forks, ProcessChange},
    stacks::modules::Modules,
    target::launch::{check_dynamic, Launched},
    target::process::{has_exited, read_cmdline, Process},
    target::search::Program,
};

pub enum Scope {
    Pid {
        pid: u32,
        pidfd: PidFd,
        command: String,
        forks: Forks,
    },
    Command {
        launched: Launched,
        pidfd: PidFd,
        /// Its command line as the report shows it (lossy UTF-8, escaped
        /// by each renderer) and, for stderr, with its exact bytes escaped.
        command: String,
        argv_shown: String,
        forks: Forks,
    },
    /// `--binary`: the processes running `path`, found by scanning /proc.
    Binary {
        path: PathBuf,
        known: BTreeMap<u32, String>,
        /// Processes that could not be added to the filter map (full).
        untraced: BTreeSet<u32>,
        /// Processes that exec'ed another program: no longer traced.
        left: BTreeSet<u32>,
        /// Processes that exited: out of the filter map.
        gone: BTreeSet<u32>,
    },
    SystemWide,
}

/// The scope and the maps of the processes known at the start.
pub struct Start {
    pub scope: Scope,
    pub maps: Vec<(u32, Vec<crate::target::process::Mapping>)>,
}

impl Scope {
    pub fn start(cli: &Cli) -> anyhow::Result<Start> {
        if let Some(pid) = cli.pid {
            let process = Process::inspect(pid)?;
            // Opened before attaching, so a reused pid cannot fool the exit
            // check.
            let pidfd = PidFd::open(pid)?;
            return Ok(Start {
                maps: vec![(pid, process.mappings)],
                scope: Scope::Pid {
                    pid,
                    pidfd,
                    command: process.command,
                    forks: Forks::new(cli.follow_forks),
                },
            });
        }
        let scope = if !cli.command.is_empty() {
            let launched = Launched::spawn(&cli.command)?;
            let pidfd = PidFd::open(launched.pid)?;
            Scope::Command {
                launched,
                pidfd,
                command: cli
                    .command
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                argv_shown: crate::target::launch::display_command(&cli.command),
                forks: Forks::new(cli.follow_forks),
            }
        } else if let Some(binary) = &cli.binary {
            let path = check_binary(binary)?;
            if !is_elf(&path) {
                anyhow::bail!(
                    "--binary {}: not an ELF executable (a script runs as its interpreter): pass \
                     the interpreter's path, or start the script with `-- {}`",
                    path.display(),
                    path.display()
                );
            }
            check_dynamic(&path)?;
            Scope::Binary {
                path,
                known: BTreeMap::new(),
                untraced: BTreeSet::new(),
                left: BTreeSet::new(),
                gone: BTreeSet::new(),
            }
        } else {
            Scope::SystemWide
        };
        Ok(Start {
            scope,
            maps: Vec::new(),
        })
    }

    /// Attaches the allocators of the processes known now (or, for a
    /// command or a binary not running yet, of the program as the dynamic
    /// loader will load it).
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        match self {
            Scope::Pid {
                pid, pidfd, forks, ..
            } => {
                let attach_pid = (!forks.follow).then_some(*pid);
                let result = loaded.add_filtered_pid(*pid).and_then(|()| {
                    hooks.hook(loaded, &Program::running(*pid)?, Some(*pid), attach_pid)
                });
                match result {
                    // perf_event_open fails with ESRCH, or /proc/PID is
                    // gone: say what happened.
                    Err(e) if pidfd.has_exited() || is_gone(&e) => {
                        return Err(TraceError::ExitedBeforeAttach(*pid).into())
                    }
                    r => r?,
                }
                if forks.follow {
                    follow_descendants(*pid, forks, loaded, hooks);
                }
                Ok(())
            }
            Scope::Command {
                launched, forks, ..
            } => {
                loaded.add_filtered_pid(launched.pid)?;
                let program = Program::to_start(&launched.path);
                let attach_pid = (!forks.follow).then_some(launched.pid);
                hooks.hook(loaded, &program, Some(launched.pid), attach_pid)
            }
            Scope::Binary { path, .. } => {
                crate::probes::loader::attach_binary_entry(loaded, path)?;
                let running = running(path);
                for &pid in &running {
                    hooks.hook_running(loaded, pid, Program::running(pid), None);
                }
                if hooks.is_empty() {
                    // Nothing runs it yet (or those that do could not be
                    // read): hook what the loader will load for it.
                    hooks.hook(loaded, &Program::to_start(path), None, None)?;
                }
                Ok(())
            }
            Scope::SystemWide => {
                let me = std::process::id();
                // Filtered out before any probe exists: its own allocations
                // while attaching would otherwise list it among the traced.
                loaded.add_filtered_pid(me)?;
                hooks.hook(loaded, &Program::running(me)?, None, None)?;
                hooks.per_process.remove(&me);
                for pid in all_pids().into_iter().filter(|&p| p != me) {
                    if !is_kernel_thread(pid) {
                        hooks.hook_running(loaded, pid, Program::running(pid), None);
                    }
                }
                // Processes that vanished while being read are not failures.
                hooks.failures.retain(|(pid, _)| !has_exited(*pid));
                Ok(())
            }
        }
    }

    /// Process `pid` called exec (see tracer-ebpf's process_exec): hook
    /// what its new image uses, and under --binary start or stop tracing it.
    pub fn on_exec(
        &mut self,
        pid: u32,
        loaded: &mut Loaded,
        hooks: &mut Hooks,
        modules: &mut Modules,
    ) {
        match self {
            Scope::Pid {
                pid: target,
                command,
                forks,
                ..
            } if *target == pid => {
                set_command(command, pid);
                let attach_pid = (!forks.follow).then_some(pid);
                hooks.hook_running(loaded, pid, Program::just_executed(pid), attach_pid);
            }
            Scope::Command {
                launched,
                command,
                forks,
                ..
            } if launched.pid == pid => {
                set_command(command, pid);
                let attach_pid = (!forks.follow).then_some(pid);
                hooks.hook_running(loaded, pid, Program::just_executed(pid), attach_pid);
            }
            Scope::Pid { forks, .. } | Scope::Command { forks, .. } => {
                // A followed child's new image may bring another allocator.
                if forks.executed(pid) {
                    hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
                    // One that exited while it was read (a shell's `true`)
                    // had nothing left to hook: not a failure.
                    hooks
                        .failures
                        .retain(|&(p, _)| p != pid || !has_exited(pid));
                }
            }
            Scope::Binary {
                path,
                known,
                untraced,
                left,
                gone,
            } => {
                // Gone already (a short-lived process): it did not leave.
                let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
                    return;
                };
                let runs_it = runs_program(&exe, path);
                if runs_it {
                    // New, or back after running something else, or a new
                    // process with the pid of one that exited.
                    if !known.contains_key(&pid) || left.contains(&pid) || gone.contains(&pid) {
                        if loaded.add_filtered_pid(pid).is_err() {
                            untraced.insert(pid);
                            return;
                        }
                        left.remove(&pid);
                        gone.remove(&pid);
                        known.insert(pid, read_cmdline(pid));
                    }
                    hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
                    modules.refresh(pid);
                } else if known.contains_key(&pid) && !left.contains(&pid) {
                    // It no longer runs the binary: stop recording it.
                    let _ = loaded.remove_filtered_pid(pid);
                    left.insert(pid);
                }
            }
            Scope::SystemWide => {
                hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
            }
        }
    }

    /// --follow-forks: processes joined (in the kernel, at fork) or left
    /// the traced set.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        if let Scope::Binary {
            known, left, gone, ..
        } = self
        {
            binary_forks(changes, known, left, gone);
            return;
        }
        let (Scope::Pid {
            pid: root,
            command: root_command,
            forks,
            ..
        }
        | Scope::Command {
            launched: Launched { pid: root, .. },
            command: root_command,
            forks,
            ..
        }) = self
        else {
            return;
        };
        for change in changes {
            match change {
                ProcessChange::Forked { child, parent } => {
                    let parent_command = if parent == *root {
                        root_command.clone()
                    } else {
                        forks.command(parent).unwrap_or_default().to_string()
                    };
                    forks.forked(child, &parent_command);
                }
                ProcessChange::Executed { pid, comm } if pid == *root => {
                    // Gone already (a command that ran for a moment): the
                    // name the kernel gave its new image, unless the
                    // command known names that program (`-- CMD`).
                    if read_cmdline(pid).is_empty() && !runs(root_command, &comm) {
                        *root_command = comm;
                    }
                }
                ProcessChange::Executed { pid, comm } => forks.renamed(pid, &comm),
                ProcessChange::Exited { pid } => forks.exited(pid),
            }
        }
    }

    /// Whether children join the traced set (--follow-forks).
    pub fn follows_forks(&self) -> bool {
        matches!(self, Scope::Pid { forks, .. } | Scope::Command { forks, .. } if forks.follow)
    }

    /// What the report says about the children of the traced process.
    pub fn fork_notes(&self, loaded: &Loaded) -> Vec<String> {
        match self {
            Scope::Pid { pid, forks, .. } => forks.notes(*pid, &loaded.counters),
            Scope::Command {
                launched, forks, ..
            } => forks.notes(launched.pid, &loaded.counters),
            Scope::Binary { .. } | Scope::SystemWide => Vec::new(),
        }
    }

    pub fn filter(&self) -> u32 {
        match self {
            Scope::Pid { .. } | Scope::Command { .. } if self.follows_forks() => FILTER_PIDS,
            Scope::Pid { .. } | Scope::Command { .. } => FILTER_NONE,
            Scope::Binary { .. } => FILTER_PIDS,
            Scope::SystemWide => FILTER_ALL,
        }
    }

    /// --binary: the program file every traced process runs.
    pub fn binary(&self) -> Option<String> {
        match self {
            Scope::Binary { path, .. } => Some(path.to_string_lossy().into_owned()),
            _ => None,
        }
    }

    /// The process whose exit ends the trace (--pid, -- CMD).
    pub fn root(&self) -> Option<u32> {
        match self {
            Scope::Pid { pid, .. } => Some(*pid),
            Scope::Command { launched, .. } => Some(launched.pid),
            Scope::Binary { .. } | Scope::SystemWide => None,
        }
    }

    /// Readable when the single traced process exits.
    pub fn exit_fd(&self) -> Option<&PidFd> {
        match self {
            Scope::Pid { pidfd, .. } | Scope::Command { pidfd, .. } => Some(pidfd),
            Scope::Binary { .. } | Scope::SystemWide => None,
        }
    }

    /// What is traced, for stderr: escaped already.
    pub fn label(&self) -> String {
        let children = if self.follows_forks() {
            " and the processes it forks"
        } else {
            ""
        };
        let label = match self {
            Scope::Pid { pid, command, .. } => format!("pid {pid} ({})", escape::text(command)),
            Scope::Command {
                launched,
                argv_shown,
                ..
            } => {
                format!("pid {} ({argv_shown})", launched.pid)
            }
            Scope::Binary { path, .. } => format!("every process running {}", escape::path(path)),
            Scope::SystemWide => "every process".to_string(),
        };
        label + children
    }

    pub fn target(&self) -> String {
        match self {
            Scope::Pid { pid, .. } => format!("pid {pid}"),
            Scope::Command { launched, .. } => format!("command {}", launched.path.display()),
            Scope::Binary { path, .. } => format!("binary {}", path.display()),
            Scope::SystemWide => "system-wide".to_string(),
        }
    }

    /// After the probes are attached: lets a held command run, and fills
    /// the process filter.
    pub fn begin(
        &mut self,
        cli: &Cli,
        loaded: &mut Loaded,
        hooks: &mut Hooks,
        modules: &mut Modules,
    ) -> anyhow::Result<()> {
        match self {
            // A held command cannot have exited; a pid may have, meanwhile.
            Scope::Pid { pid, pidfd, .. } if pidfd.has_exited() => {
                Err(TraceError::ExitedBeforeAttach(*pid).into())
            }
            Scope::Command { launched, .. } => launched.release(),
            Scope::SystemWide => {
                loaded.add_filtered_pid(std::process::id())?;
                for &pid in &cli.exclude_pid {
                    loaded.add_filtered_pid(pid)?;
                }
                Ok(())
            }
            Scope::Binary { .. } => {
                self.poll(loaded, hooks, modules);
                Ok(())
            }
            Scope::Pid { .. } => Ok(()),
        }
    }

    /// Called every POLL_INTERVAL: picks up new processes running the
    /// binary (their allocations before that are not seen).
    pub fn poll(&mut self, loaded: &mut Loaded, hooks: &mut Hooks, modules: &mut Modules) {
        let Scope::Binary {
            path,
            known,
            untraced,
            gone,
            ..
        } = self
        else {
            return;
        };
        let now = running(path);
        // Exited processes leave the filter, so that a new process that
        // reuses the pid is not traced for running something else.
        for &pid in known.keys() {
            if now.binary_search(&pid).is_err() && !gone.contains(&pid) && has_exited(pid) {
                let _ = loaded.remove_filtered_pid(pid);
                gone.insert(pid);
            }
        }
        for pid in now {
            let reused = gone.contains(&pid);
            if (known.contains_key(&pid) && !reused) || untraced.contains(&pid) {
                continue;
            }
            // A full filter map must not end the trace: count and go on.
            if loaded.add_filtered_pid(pid).is_err() {
                untraced.insert(pid);
                continue;
            }
            gone.remove(&pid);
            if reused || !hooks.per_process.contains_key(&pid) {
                hooks.hook_running(loaded, pid, Program::running(pid), None);
            }
            modules.refresh(pid);
            known.insert(pid, read_cmdline(pid));
        }
    }

    /// On SIGCHLD: a started command's ptrace stops (see `Launched`);
    /// `at_exit(pid)` runs at its exit stop, while its maps can be read.
    pub fn service_child(&mut self, mut at_exit: impl FnMut(u32)) {
        if let Scope::Command { launched, .. } = self {
            let pid = launched.pid;
            launched.service(|| at_exit(pid));
        }
    }

    /// A started command that is still running, if any.
    pub fn running_command(&mut self) -> Option<&mut Launched> {
        match self {
            Scope::Command {
                launched, pidfd, ..
            } if !launched.has_ended() && !pidfd.has_exited() => Some(launched),
            _ => None,
        }
    }

    /// A started command's exit code as a shell gives it, once it ended.
    pub fn command_status(&mut self) -> Option<u8> {
        match self {
            Scope::Command { launched, .. } => launched.shell_status(),
            _ => None,
        }
    }

    /// The trace ended: a started command is no longer held.
    pub fn let_go(&mut self) {
        if let Scope::Command { launched, .. } = self {
            launched.let_go();
        }
    }

    /// What the report must say about the scope itself.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if let Scope::Binary {
            path,
            untraced,
            left,
            ..
        } = self
        {
            if !untraced.is_empty() {
                let n = untraced.len() as u64;
                notes.push(format!(
                    "{} running {} {} not traced: the process filter map ({} entries) was full",
                    crate::report::counted(n, "process", "processes"),
                    crate::report::was(n),
                    path.display(),
                    crate::probes::loader::MAX_FILTERED_PIDS
                ));
            }
            for pid in left {
                notes.push(format!(
                    "process {pid} exec'ed another program and was no longer traced from then on"
                ));
            }
        }
        notes
    }

    /// Every process traced, for the report: those the events came from
    /// (`seen`, each a pid and start time) and those known to the scope;
    /// the one whose exit ends the trace first.
    pub fn processes(&mut self, seen: &ProcessTable) -> Vec<ProcessInfo> {
        let mut all: Vec<ProcessInfo> = seen
            .iter()
            .map(|r| ProcessInfo {
                pid: r.pid,
                start_time: r.start_time,
                command: r.command.clone(),
                program: r.program.clone(),
                exited: r.exited || crate::collect::collector::has_exited(r.pid, r.start_time),
                exit_status: None,
                allocators: Vec::new(),
            })
            .collect();
        all.sort_by_key(|p| (p.pid, p.start_time));
        match self {
            Scope::Pid {
                pid,
                command,
                pidfd,
                forks,
            } => {
                let root = root_first(&mut all, *pid);
                if !command.is_empty() {
                    root.command.clone_from(command);
                }
                root.exited = pidfd.has_exited();
                forks.merge_processes(&mut all);
            }
            Scope::Command {
                launched,
                command,
                pidfd,
                forks,
                ..
            } => {
                let status = launched.exit_status();
                let root = root_first(&mut all, launched.pid);
                root.command.clone_from(command);
                // The file started, whole even with spaces in its path.
                root.program = launched.path.to_string_lossy().into_owned();
                root.exited = pidfd.has_exited() || status.is_some();
                root.exit_status = status;
                forks.merge_processes(&mut all);
            }
            Scope::Binary { known, .. } => {
                for (&pid, command) in known.iter() {
                    if !all.iter().any(|p| p.pid == pid) {
                        all.push(ProcessInfo {
                            pid,
                            start_time: crate::collect::collector::start_time(pid),
                            command: command.clone(),
                            program: program_of(pid).unwrap_or_default(),
                            exited: has_exited(pid),
                            exit_status: None,
                            allocators: Vec::new(),
                        });
                    }
                }
                all.sort_by_key(|p| (p.pid, p.start_time));
            }
            Scope::SystemWide => {}
        }
        all
    }
}

/// Moves the first process with pid `root` (traced from the start, it is
/// the oldest) to the front of `all`, adding it when no event came from
/// it, and returns it.
fn root_first(all: &mut Vec<ProcessInfo>, root: u32) -> &mut ProcessInfo {
    let entry = match all.iter().position(|p| p.pid == root) {
        Some(i) => all.remove(i),
        None => ProcessInfo {
            pid: root,
            start_time: crate::collect::collector::start_time(root),
            program: program_of(root).unwrap_or_default(),
            ..ProcessInfo::default()
        },
    };
    all.insert(0, entry);
    &mut all[0]
}

/// Whether `command`'s program is the one the kernel named `comm` (the
/// file name, cut to 15 bytes).
fn runs(command: &str, comm: &str) -> bool {
    let program = command.split_whitespace().next().unwrap_or("");
    let name = program.rsplit('/').next().unwrap_or(program);
    !comm.is_empty() && name.starts_with(comm)
}

/// The command line of `pid` after its exec; kept as it was (the kernel's
/// name for the new image, see on_process_changes) if it already exited.
fn set_command(command: &mut String, pid: u32) {
    let now = read_cmdline(pid);
    if !now.is_empty() {
        *command = now;
    }
}

/// --binary: a child forked by a traced process runs the binary too, and
/// joined the traced set in the kernel at fork.
fn binary_forks(
    changes: Vec<ProcessChange>,
    known: &mut BTreeMap<u32, String>,
    left: &mut BTreeSet<u32>,
    gone: &mut BTreeSet<u32>,
) {
    for change in changes {
        if let ProcessChange::Forked { child, parent } = change {
            let mut command = read_cmdline(child);
            if command.is_empty() {
                command = known.get(&parent).cloned().unwrap_or_default();
            }
            known.insert(child, command);
            left.remove(&child);
            gone.remove(&child);
        }
    }
}

/// --pid --follow-forks: the target's descendants running now join the
/// traced set (those forked from now on join in the kernel), each with
/// its allocators hooked.
fn follow_descendants(root: u32, forks: &mut Forks, loaded: &mut Loaded, hooks: &mut Hooks) {
    for (pid, _parent) in Forks::descendants(root) {
        if loaded.add_filtered_pid(pid).is_err() {
            hooks
                .failures
                .push((pid, "the process filter map is full".into()));
            continue;
        }
        forks.forked(pid, "");
        hooks.hook_running(loaded, pid, Program::running(pid), None);
    }
}

/// Pids whose /proc/PID/exe is `path`, sorted.
fn running(path: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| runs_program(&exe, path))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether a process whose /proc/PID/exe reads `exe` runs the program at
/// `path`: also when the file it runs was deleted or replaced since (a
/// package upgrade under a running service), which the kernel shows as
/// "PATH (deleted)"; its objects are then read through map_files.
fn runs_program(exe: &Path, path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let exe = exe.as_os_str().as_bytes();
    exe.strip_suffix(b" (deleted)").unwrap_or(exe) == path.as_os_str().as_bytes()
}

/// Whether `path` starts with the ELF magic (only its first bytes are read).
/// The error says the process is gone or exiting: perf_event_open's
/// ESRCH comes as soon as it is killed, before its pidfd reports the exit.
fn is_gone(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        let esrch = cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::ESRCH));
        let vanished = matches!(
            cause.downcast_ref::<TraceError>(),
            Some(TraceError::NoSuchProcess(_) | TraceError::Zombie(_))
        );
        esrch || vanished
    })
}

/// The `--binary` path, resolved, once it names a program file that a
/// process can run; otherwise what is wrong with it.
fn check_binary(binary: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = binary.display();
    let path = std::fs::canonicalize(binary).with_context(|| {
        format!("--binary {shown}: no such file: pass the path of the program to trace")
    })?;
    let meta = std::fs::metadata(&path).with_context(|| format!("--binary {shown}"))?;
    if meta.is_dir() {
        anyhow::bail!("--binary {shown} is a directory: pass the path of the program file in it");
    }
    if is_shared_library(&path) {
        anyhow::bail!(
            "--binary {shown} is a shared library, not a program: pass the program that loads \
             it (--binary PROGRAM or --pid PID)"
        );
    }
    if let Ok(info) = crate::target::elf::ObjectInfo::parse(&path) {
        let exe = path.display().to_string();
        if !info.is_native() {
            let machine = info.machine().to_string();
            return Err(TraceError::NotX86_64 { exe, machine }.into());
        }
        if info.is_static() && !info.defines_malloc_and_free() && info.has_symbols() {
            return Err(TraceError::OwnAllocator { exe }.into());
        }
    }
    // A script has its own message (is_elf in Scope::start).
    if meta.permissions().mode() & 0o111 == 0 && is_elf(&path) {
        anyhow::bail!(
            "--binary {shown} is not executable (mode {:o}), so no process runs it: pass the \
             program file, or make it executable with chmod +x",
            meta.permissions().mode() & 0o7777
        );
    }
    Ok(path)
}

/// An ELF shared object that is not an executable: no interpreter and no
/// DF_1_PIE flag (a position-independent executable has one or both).
fn is_shared_library(path: &Path) -> bool {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else {
        return false;
    };
    let endian = elf.endian();
    if elf.elf_header().e_type(endian) != object::elf::ET_DYN {
        return false;
    }
    let has_interp = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP);
    let pie = elf
        .elf_section_table()
        .dynamic_table(endian, &*data)
        .unwrap_or_default()
        .iter()
        .any(|d| d.tag == object::elf::DT_FLAGS_1 && d.val & u64::from(object::elf::DF_1_PIE) != 0);
    !has_interp && !pie
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

/// argv[0] of a running process. A program that rewrote its argv into one
/// title (`redis-server *:6379`) gives the title's first word, unless the
/// whole names an existing file (a path with spaces).
pub fn program_of(pid: u32) -> Option<String> {
    let raw = crate::target::process::read_cmdline_raw(pid)?;
    let argv0 = raw.split(|&b| b == 0).next().filter(|a| !a.is_empty())?;
    let argv0 = String::from_utf8_lossy(argv0).into_owned();
    let file = match argv0.starts_with('/') {
        true => format!("/proc/{pid}/root{argv0}"),
        false => format!("/proc/{pid}/cwd/{argv0}"),
    };
    match argv0.split_whitespace().next() {
        Some(first) if first != argv0 && !Path::new(&file).is_file() => Some(first.to_string()),
        _ => Some(argv0),
    }
}

/// Every pid in /proc.
fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn is_kernel_thread(pid: u32) -> bool {
    crate::target::process::read_stat(pid)
        .is_some_and(|stat| crate::target::process::is_kernel_thread(&stat))
}

/// A pidfd: readable once the process has exited.
pub struct PidFd {
    pub fd: OwnedFd,
}

impl PidFd {
    fn open(pid: u32) -> Result<PidFd, TraceError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            return Err(TraceError::NoSuchProcess(pid));
        }
        // SAFETY: fd is a fresh descriptor that we own from here on.
        Ok(PidFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) },
        })
    }

    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{runs, runs_program};

    #[test]
    fn a_replaced_or_deleted_program_still_runs_the_binary() {
        let path = Path::new("/usr/sbin/my service");
        assert!(runs_program(Path::new("/usr/sbin/my service"), path));
        assert!(runs_program(
            Path::new("/usr/sbin/my service (deleted)"),
            path
        ));
        assert!(!runs_program(Path::new("/usr/sbin/my service2"), path));
        assert!(!runs_program(Path::new("/usr/sbin/my (deleted)"), path));
    }

    #[test]
    fn a_command_runs_the_program_the_kernel_names_by_its_cut_file_name() {
        assert!(runs("sh -c true", "sh"));
        assert!(runs("/usr/bin/python3.11 x.py", "python3.11"));
        assert!(runs("./a-very-long-program-name --x", "a-very-long-pro"));
        assert!(!runs("sh -c /bin/true", "true"));
        assert!(!runs("", "sh"));
        assert!(!runs("sh", ""));
    }
}
