//! What is traced: one process or a command started by memtrace-bpf
//! (`Single`), every process running a program file (`Binary`), or every
//! process on the machine.

use tracer_common::{FILTER_ALL, FILTER_NONE, FILTER_PIDS};

use crate::{
    cli::Cli,
    collect::processes::ProcessTable,
    probes::{hooks::Hooks, loader::Loaded},
    report::ProcessInfo,
    session::{binary::Binary, forks::ProcessChange, single::Single},
    stacks::modules::Modules,
    tracee::{
        launch::Launched,
        liveness::PidFd,
        process::{has_exited, Mapping},
        search::Program,
    },
};

pub enum Scope {
    /// `--pid` or `-- CMD`.
    Single(Single),
    /// `--binary`.
    Binary(Binary),
    SystemWide,
}

/// The scope and the maps of the processes known at the start.
pub struct Start {
    pub scope: Scope,
    pub maps: Vec<(u32, Vec<Mapping>)>,
}

impl Scope {
    pub fn start(cli: &Cli) -> anyhow::Result<Start> {
        let (scope, maps) = if let Some(pid) = cli.pid {
            let (single, maps) = Single::attach_to(cli, pid)?;
            (Scope::Single(single), vec![(pid, maps)])
        } else if !cli.command.is_empty() {
            (Scope::Single(Single::start(cli)?), Vec::new())
        } else if let Some(binary) = &cli.binary {
            (Scope::Binary(Binary::new(binary)?), Vec::new())
        } else {
            (Scope::SystemWide, Vec::new())
        };
        Ok(Start { scope, maps })
    }

    /// Attaches the allocators of the processes known now (or, for a
    /// command or a binary not running yet, of the program as the dynamic
    /// loader will load it).
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        match self {
            Scope::Single(single) => single.hook_initial(loaded, hooks),
            Scope::Binary(binary) => binary.hook_initial(loaded, hooks),
            Scope::SystemWide => hook_every_process(loaded, hooks),
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
            Scope::Single(single) => single.on_exec(pid, loaded, hooks),
            Scope::Binary(binary) => binary.on_exec(pid, loaded, hooks, modules),
            Scope::SystemWide => {
                hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
            }
        }
    }

    /// Processes that forked, exec'ed or exited.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        match self {
            Scope::Single(single) => single.on_process_changes(changes),
            Scope::Binary(binary) => binary.on_process_changes(changes),
            Scope::SystemWide => {}
        }
    }

    /// Whether children join the traced set (--follow-forks).
    pub fn follows_forks(&self) -> bool {
        matches!(self, Scope::Single(single) if single.forks.follow)
    }

    /// What the report says about the children of the traced process.
    pub fn fork_notes(&self, loaded: &Loaded) -> Vec<String> {
        match self {
            Scope::Single(single) => single.forks.notes(single.pid, &loaded.counters),
            Scope::Binary(_) | Scope::SystemWide => Vec::new(),
        }
    }

    pub fn filter(&self) -> u32 {
        match self {
            Scope::Single(_) if self.follows_forks() => FILTER_PIDS,
            Scope::Single(_) => FILTER_NONE,
            Scope::Binary(_) => FILTER_PIDS,
            Scope::SystemWide => FILTER_ALL,
        }
    }

    /// --binary: the program file every traced process runs.
    pub fn binary(&self) -> Option<String> {
        match self {
            Scope::Binary(binary) => Some(binary.path.to_string_lossy().into_owned()),
            _ => None,
        }
    }

    /// The process whose exit ends the trace (--pid, -- CMD).
    pub fn root(&self) -> Option<u32> {
        match self {
            Scope::Single(single) => Some(single.pid),
            Scope::Binary(_) | Scope::SystemWide => None,
        }
    }

    /// The program of a started command (-- CMD), before it runs.
    pub fn command_path(&self) -> Option<&std::path::Path> {
        match self {
            Scope::Single(single) => single.command_path(),
            Scope::Binary(_) | Scope::SystemWide => None,
        }
    }

    /// Readable when the single traced process exits.
    pub fn exit_fd(&self) -> Option<&PidFd> {
        match self {
            Scope::Single(single) => Some(&single.pidfd),
            Scope::Binary(_) | Scope::SystemWide => None,
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
            Scope::Single(single) => single.label(),
            Scope::Binary(binary) => {
                format!(
                    "every process running {}",
                    crate::escape::path(&binary.path)
                )
            }
            Scope::SystemWide => "every process".to_string(),
        };
        label + children
    }

    pub fn target(&self) -> String {
        match self {
            Scope::Single(single) => single.target(),
            Scope::Binary(binary) => format!("binary {}", binary.path.display()),
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
            Scope::Single(single) => single.begin(),
            Scope::SystemWide => {
                loaded.add_filtered_pid(std::process::id())?;
                for &pid in &cli.exclude_pid {
                    loaded.add_filtered_pid(pid)?;
                }
                Ok(())
            }
            Scope::Binary(binary) => {
                binary.poll(loaded, hooks, modules);
                Ok(())
            }
        }
    }

    /// Called every POLL_INTERVAL: picks up new processes running the
    /// binary (their allocations before that are not seen).
    pub fn poll(&mut self, loaded: &mut Loaded, hooks: &mut Hooks, modules: &mut Modules) {
        if let Scope::Binary(binary) = self {
            binary.poll(loaded, hooks, modules);
        }
    }

    /// On SIGCHLD: a started command's ptrace stops (see `Launched`);
    /// `at_exit(pid)` runs at its exit stop, while its maps can be read.
    pub fn service_child(&mut self, mut at_exit: impl FnMut(u32)) {
        if let Some(launched) = self.launched() {
            let pid = launched.pid;
            launched.service(|| at_exit(pid));
        }
    }

    fn launched(&mut self) -> Option<&mut Launched> {
        match self {
            Scope::Single(single) => single.launched(),
            Scope::Binary(_) | Scope::SystemWide => None,
        }
    }

    /// A started command that is still running, if any.
    pub fn running_command(&mut self) -> Option<&mut Launched> {
        let Scope::Single(single) = self else {
            return None;
        };
        let exited = single.pidfd.has_exited();
        single
            .launched()
            .filter(|launched| !launched.has_ended() && !exited)
    }

    /// A started command's exit code as a shell gives it, once it ended.
    pub fn command_status(&mut self) -> Option<u8> {
        self.launched().and_then(|launched| launched.shell_status())
    }

    /// The trace ended: a started command is no longer held.
    pub fn let_go(&mut self) {
        if let Some(launched) = self.launched() {
            launched.let_go();
        }
    }

    /// What the report must say about the scope itself.
    pub fn notes(&self) -> Vec<String> {
        match self {
            Scope::Binary(binary) => binary.notes(),
            Scope::Single(_) | Scope::SystemWide => Vec::new(),
        }
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
                exited: r.exited
                    || r.folded > 0
                    || crate::tracee::liveness::has_exited_since(r.pid, r.start_time),
                exit_status: None,
                allocators: Vec::new(),
                folded: r.folded,
            })
            .collect();
        // Groups of folded exited processes last.
        all.sort_by_key(|p| (p.folded > 0, p.pid, p.start_time));
        match self {
            Scope::Single(single) => single.merge_processes(&mut all),
            Scope::Binary(binary) => binary.merge_processes(&mut all),
            Scope::SystemWide => {}
        }
        all
    }
}

/// System-wide: the allocators of every process running now (this one
/// is filtered out before any probe exists: its own allocations while
/// attaching would otherwise list it among the traced).
fn hook_every_process(loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
    let me = std::process::id();
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
    crate::tracee::process::read_stat(pid)
        .is_some_and(|stat| crate::tracee::process::is_kernel_thread(&stat))
}
