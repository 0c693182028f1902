//! What is traced: one process or a command started by memtrace-bpf
//! (`Single`), every process running a program file (`Binary`), every
//! process of a cgroup v2 subtree (`Cgroup`), or every process on the
//! machine.

use crate::collect::{Exec, ProcessChange};
use crate::session::config::{Target, TraceConfig};
use tracer_common::{FILTER_ALL, FILTER_CGROUP, FILTER_NONE, FILTER_PIDS};

use crate::{
    collect::processes::ProcessTable,
    probes::{hooks::Hooks, loader::Loaded},
    report::{Note, ProcessInfo},
    session::{binary::Binary, cgroup::Cgroup, single::Single},
    tracee::{launch::Launched, liveness::PidFd, search::Program},
};

pub enum Scope {
    /// `--pid` or `-- CMD`.
    Single(Single),
    /// `--binary`.
    Binary(Binary),
    /// `--cgroup`.
    Cgroup(Cgroup),
    SystemWide,
}

impl Scope {
    /// `ancestor_cgroup`: the kernel offers uprobe programs the calling
    /// task's cgroup ancestry (else --cgroup follows its process list).
    pub fn start(config: &TraceConfig, ancestor_cgroup: bool) -> anyhow::Result<Scope> {
        Ok(match &config.target {
            Target::Pid(pid) => Scope::Single(Single::attach_to(
                *pid,
                config.follow_forks,
                config.exited_processes,
            )?),
            Target::Command(args) => Scope::Single(Single::start(
                args,
                config.follow_forks,
                config.exited_processes,
            )?),
            Target::Binary(binary) => Scope::Binary(Binary::new(binary)?),
            Target::Cgroup(path) => Scope::Cgroup(Cgroup::new(
                path,
                !ancestor_cgroup || super::cgroup::by_processes_forced(),
                config.verbose,
            )?),
            Target::SystemWide { .. } => Scope::SystemWide,
        })
    }

    /// Attaches the allocators of the processes known now (or, for a
    /// command or a binary not running yet, of the program as the dynamic
    /// loader will load it).
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        match self {
            Scope::Single(single) => single.hook_initial(loaded, hooks),
            Scope::Binary(binary) => binary.hook_initial(loaded, hooks),
            Scope::Cgroup(cgroup) => cgroup.hook_initial(loaded, hooks),
            Scope::SystemWide => hook_every_process(loaded, hooks),
        }
    }

    /// Process `pid` called exec (see tracer-ebpf's process_exec): hook
    /// what its new image uses, and under --binary start or stop tracing it.
    /// True when its maps must be read now (it joined the traced set).
    pub fn on_exec(&mut self, exec: Exec, loaded: &mut Loaded, hooks: &mut Hooks) -> bool {
        let pid = exec.pid;
        match self {
            Scope::Single(single) => {
                single.on_exec(exec, loaded, hooks);
                false
            }
            Scope::Binary(binary) => binary.on_exec(pid, loaded, hooks),
            Scope::Cgroup(cgroup) => {
                cgroup.on_exec(pid, loaded, hooks);
                false
            }
            Scope::SystemWide => {
                hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
                false
            }
        }
    }

    /// Processes that forked, exec'ed or exited.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        match self {
            Scope::Single(single) => single.on_process_changes(changes),
            Scope::Binary(binary) => binary.on_process_changes(changes),
            Scope::Cgroup(cgroup) => cgroup.on_process_changes(changes),
            Scope::SystemWide => {}
        }
    }

    /// Whether children join the traced set in the kernel at fork
    /// (--follow-forks, and --cgroup followed by its process list).
    pub fn follows_forks(&self) -> bool {
        match self {
            Scope::Single(single) => single.forks.follow,
            Scope::Cgroup(cgroup) => cgroup.by_processes(),
            Scope::Binary(_) | Scope::SystemWide => false,
        }
    }

    /// What the report says about the children of the traced process.
    pub fn fork_notes(&self, loaded: &Loaded) -> Vec<Note> {
        match self {
            Scope::Single(single) => single.forks.notes(single.pid, &loaded.counters),
            Scope::Cgroup(cgroup) if cgroup.by_processes() => {
                super::forks::not_followed(&loaded.counters)
                    .into_iter()
                    .collect()
            }
            Scope::Binary(_) | Scope::Cgroup(_) | Scope::SystemWide => Vec::new(),
        }
    }

    pub fn filter(&self) -> u32 {
        match self {
            Scope::Single(_) if self.follows_forks() => FILTER_PIDS,
            Scope::Single(_) => FILTER_NONE,
            Scope::Binary(_) => FILTER_PIDS,
            Scope::Cgroup(cgroup) if cgroup.by_processes() => FILTER_PIDS,
            Scope::Cgroup(_) => FILTER_CGROUP,
            Scope::SystemWide => FILTER_ALL,
        }
    }

    /// `--cgroup`: what the BPF filter compares (zero otherwise).
    pub fn cgroup_filter(&self) -> crate::probes::CgroupFilter {
        match self {
            Scope::Cgroup(cgroup) => cgroup.filter(),
            _ => crate::probes::CgroupFilter::default(),
        }
    }

    /// --binary: the program file every traced process runs.
    pub fn binary(&self) -> Option<String> {
        match self {
            Scope::Binary(binary) => Some(binary.name().to_string_lossy().into_owned()),
            _ => None,
        }
    }

    /// --binary through a symbolic link: (the file, the path given), so
    /// that frames in the file are shown under the name given.
    pub fn binary_alias(&self) -> Option<(String, String)> {
        match self {
            Scope::Binary(binary) => binary.given.as_ref().map(|given| {
                (
                    binary.path.to_string_lossy().into_owned(),
                    given.to_string_lossy().into_owned(),
                )
            }),
            _ => None,
        }
    }

    /// `-- CMD`: the one process is traced from its first instruction, so
    /// no block it frees was allocated before the trace.
    pub fn traced_from_start(&self) -> bool {
        matches!(self, Scope::Single(single) if single.is_launched())
    }

    /// The process whose exit ends the trace (--pid, -- CMD).
    /// --cgroup: where the cgroup's memory numbers are read (its own
    /// files, or on a host whose memory controller is on cgroup v1, its
    /// counterpart there); None for other scopes.
    pub fn memory_files(&self) -> Option<crate::tracee::memory::CgroupMemoryFiles> {
        match self {
            Scope::Cgroup(cgroup) => {
                let traced = &cgroup.cgroup;
                let member = traced.processes().first().copied();
                crate::tracee::memory::CgroupMemoryFiles::find(&traced.dir, &traced.path, member)
            }
            Scope::Single(_) | Scope::Binary(_) | Scope::SystemWide => None,
        }
    }

    pub fn root(&self) -> Option<u32> {
        match self {
            Scope::Single(single) => Some(single.pid),
            Scope::Binary(_) | Scope::Cgroup(_) | Scope::SystemWide => None,
        }
    }

    /// The program of a started command (-- CMD), before it runs.
    pub fn command_path(&self) -> Option<&std::path::Path> {
        match self {
            Scope::Single(single) => single.command_path(),
            Scope::Binary(_) | Scope::Cgroup(_) | Scope::SystemWide => None,
        }
    }

    /// Readable when the single traced process exits.
    pub fn exit_fd(&self) -> Option<&PidFd> {
        match self {
            Scope::Single(single) => Some(&single.pidfd),
            Scope::Binary(_) | Scope::Cgroup(_) | Scope::SystemWide => None,
        }
    }

    /// What is traced, for stderr: escaped already.
    pub fn label(&self) -> String {
        let children = if matches!(self, Scope::Single(single) if single.forks.follow) {
            " and the processes it forks"
        } else {
            ""
        };
        let label = match self {
            Scope::Single(single) => single.label(),
            Scope::Binary(binary) => {
                format!("every process running {}", binary.shown())
            }
            Scope::Cgroup(cgroup) => cgroup.label(),
            Scope::SystemWide => "every process".to_string(),
        };
        label + children
    }

    pub fn target(&self) -> String {
        match self {
            Scope::Single(single) => single.target(),
            Scope::Binary(binary) => match &binary.given {
                Some(given) => format!("binary {} ({})", given.display(), binary.path.display()),
                None => format!("binary {}", binary.path.display()),
            },
            Scope::Cgroup(cgroup) => cgroup.target(),
            Scope::SystemWide => "system-wide".to_string(),
        }
    }

    /// After the probes are attached: lets a held command run, and fills
    /// the process filter. Returns the processes whose maps to read now.
    pub fn begin(
        &mut self,
        config: &TraceConfig,
        loaded: &mut Loaded,
        hooks: &mut Hooks,
    ) -> anyhow::Result<Vec<u32>> {
        match self {
            Scope::Single(single) => single.begin(),
            Scope::SystemWide => {
                loaded.add_filtered_pid(std::process::id())?;
                if let Target::SystemWide { exclude, .. } = &config.target {
                    for &pid in exclude {
                        loaded.add_filtered_pid(pid)?;
                    }
                }
                Ok(Vec::new())
            }
            Scope::Binary(binary) => Ok(binary.poll(loaded, hooks)),
            Scope::Cgroup(cgroup) => Ok(cgroup.poll(loaded, hooks)),
        }
    }

    /// Called every POLL_INTERVAL: picks up new processes running the
    /// binary (their allocations before that are not seen).
    /// Returns the processes whose maps to read now.
    pub fn poll(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> Vec<u32> {
        match self {
            Scope::Binary(binary) => binary.poll(loaded, hooks),
            Scope::Cgroup(cgroup) => cgroup.poll(loaded, hooks),
            Scope::Single(_) | Scope::SystemWide => Vec::new(),
        }
    }

    /// On SIGCHLD: a started command's ptrace stops (see `Launched`);
    /// `at_exit(pid)` runs at its exit stop, while its maps can be read,
    /// `at_exec(pid)` at an exec, before the new image runs; if it returns
    /// true, `at_entry(pid)` at the new image's entry point, its libraries
    /// mapped.
    pub fn service_child(
        &mut self,
        mut at_exit: impl FnMut(u32),
        mut at_exec: impl FnMut(u32) -> bool,
        mut at_entry: impl FnMut(u32),
    ) {
        if let Some(launched) = self.launched() {
            let pid = launched.pid;
            launched.service(|| at_exit(pid), || at_exec(pid), || at_entry(pid));
        }
    }

    fn launched(&mut self) -> Option<&mut Launched> {
        match self {
            Scope::Single(single) => single.launched(),
            Scope::Binary(_) | Scope::Cgroup(_) | Scope::SystemWide => None,
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

    /// What the report must say about the scope itself (times from
    /// `started`, the trace's start).
    pub fn notes(&self, started: std::time::Instant) -> Vec<Note> {
        match self {
            Scope::Binary(binary) => binary.notes(),
            Scope::Cgroup(cgroup) => cgroup.notes(started),
            Scope::Single(single) => single.notes(),
            Scope::SystemWide => Vec::new(),
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
                oom_killed: None,
                temporary: None,
                // Filled in by the profile (collect/profile.rs).
                peak: None,
                // Filled in by the session (memory_watch.rs).
                memory: None,
                identity: r.identity.clone(),
            })
            .collect();
        // Groups of folded exited processes last.
        all.sort_by_key(|p| (p.folded > 0, p.pid, p.start_time));
        match self {
            Scope::Single(single) => single.merge_processes(&mut all),
            Scope::Binary(binary) => binary.merge_processes(&mut all),
            Scope::Cgroup(_) | Scope::SystemWide => {}
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
    hooks.forget(me);
    for pid in all_pids().into_iter().filter(|&p| p != me) {
        if !is_kernel_thread(pid) {
            hooks.hook_running(loaded, pid, Program::running(pid), None);
        }
    }
    hooks.drop_vanished(None);
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
