//! What is traced: one process, a command started by memtrace-bpf, every
//! process running a program file, or every process on the machine.

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use tracer_common::{FILTER_ALL, FILTER_NONE, FILTER_PIDS};

use crate::{
    cli::Cli,
    error::TraceError,
    launch::{check_dynamic, Launched},
    loader::Loaded,
    report::ProcessInfo,
    symbolize::Modules,
    target::{read_cmdline, Process},
};

pub enum Scope {
    Pid {
        pid: u32,
        pidfd: PidFd,
        command: String,
    },
    Command {
        launched: Launched,
        pidfd: PidFd,
        command: String,
    },
    /// `--binary`: the processes running `path`, found by scanning /proc.
    Binary {
        path: PathBuf,
        known: BTreeMap<u32, String>,
        /// Processes that could not be added to the filter map (full).
        untraced: Vec<u32>,
    },
    SystemWide,
}

/// The scope, the libc to hook (as the first process sees it, and as a path
/// to open from here), and the maps of the processes known at the start.
pub struct Start {
    pub scope: Scope,
    pub libc: String,
    pub libc_host_path: PathBuf,
    pub maps: Vec<(u32, Vec<crate::target::Mapping>)>,
    /// Which allocator `libc` is: "glibc", "jemalloc", ...
    pub allocator: String,
}

impl Scope {
    pub fn start(cli: &Cli) -> anyhow::Result<Start> {
        if let Some(pid) = cli.pid {
            let process = Process::inspect(pid)?;
            let allocator = process.allocator()?;
            let (libc, kind) = (allocator.path, allocator.kind);
            // Opened before attaching, so a reused pid cannot fool the exit
            // check.
            let pidfd = PidFd::open(pid)?;
            return Ok(Start {
                libc_host_path: crate::target::host_path(pid, &libc),
                libc,
                maps: vec![(pid, process.mappings)],
                allocator: kind,
                scope: Scope::Pid {
                    pid,
                    pidfd,
                    command: process.command,
                },
            });
        }
        // The others are hooked in the libc this tracer uses unless a
        // running process shows another: they run on the same system.
        let me = Process::inspect(std::process::id())?;
        let own_libc = me.libc_path()?;
        let own = |scope| Start {
            libc_host_path: crate::target::host_path(me.pid, &own_libc),
            libc: own_libc.clone(),
            maps: Vec::new(),
            allocator: "glibc".to_string(),
            scope,
        };
        if !cli.command.is_empty() {
            let launched = Launched::spawn(&cli.command)?;
            let pidfd = PidFd::open(launched.pid)?;
            return Ok(own(Scope::Command {
                launched,
                pidfd,
                command: cli.command.join(" "),
            }));
        }
        if let Some(binary) = &cli.binary {
            let path = std::fs::canonicalize(binary)
                .with_context(|| format!("--binary {}: no such file", binary.display()))?;
            check_dynamic(&path)?;
            let running = running(&path);
            let mut start = own(Scope::Binary {
                path,
                known: BTreeMap::new(),
                untraced: Vec::new(),
            });
            if let Some(&pid) = running.first() {
                if let Ok(process) = Process::inspect(pid) {
                    if let Ok(libc) = process.libc_path() {
                        start.libc_host_path = crate::target::host_path(pid, &libc);
                        start.libc = libc;
                    }
                }
            }
            return Ok(start);
        }
        Ok(own(Scope::SystemWide))
    }

    pub fn filter(&self) -> u32 {
        match self {
            Scope::Pid { .. } | Scope::Command { .. } => FILTER_NONE,
            Scope::Binary { .. } => FILTER_PIDS,
            Scope::SystemWide => FILTER_ALL,
        }
    }

    /// The one process the probes are attached for, if only one.
    pub fn attach_pid(&self) -> Option<u32> {
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

    pub fn label(&self) -> String {
        match self {
            Scope::Pid { pid, command, .. } => format!("pid {pid} ({command})"),
            Scope::Command {
                launched, command, ..
            } => {
                format!("pid {} ({command})", launched.pid)
            }
            Scope::Binary { path, .. } => format!("every process running {}", path.display()),
            Scope::SystemWide => "every process".to_string(),
        }
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
                self.poll(loaded, modules);
                Ok(())
            }
            Scope::Pid { .. } => Ok(()),
        }
    }

    /// Called every POLL_INTERVAL: picks up new processes running the
    /// binary (their allocations before that are not seen).
    pub fn poll(&mut self, loaded: &mut Loaded, modules: &mut Modules) {
        let Scope::Binary {
            path,
            known,
            untraced,
        } = self
        else {
            return;
        };
        for pid in running(path) {
            if known.contains_key(&pid) || untraced.contains(&pid) {
                continue;
            }
            // A full filter map must not end the trace: count and go on.
            if loaded.add_filtered_pid(pid).is_err() {
                untraced.push(pid);
                continue;
            }
            modules.refresh(pid);
            known.insert(pid, read_cmdline(pid));
        }
    }

    /// What the report must say about the scope itself.
    pub fn notes(&self) -> Vec<String> {
        match self {
            Scope::Binary { path, untraced, .. } if !untraced.is_empty() => vec![format!(
                "{} processes running {} were not traced: the process filter map ({} entries) was full",
                untraced.len(),
                path.display(),
                crate::loader::MAX_FILTERED_PIDS
            )],
            _ => Vec::new(),
        }
    }

    /// Every process traced, for the report: those known to the scope and
    /// those the events came from (`seen`).
    pub fn processes(&self, seen: &BTreeMap<u32, String>) -> Vec<ProcessInfo> {
        let info = |pid: u32, command: &str, exit_status: Option<String>| ProcessInfo {
            pid,
            command: command.to_string(),
            exited: exit_status.is_some() || has_exited(pid),
            exit_status,
        };
        match self {
            Scope::Pid {
                pid,
                command,
                pidfd,
            } => vec![ProcessInfo {
                exited: pidfd.has_exited(),
                ..info(*pid, command, None)
            }],
            Scope::Command {
                launched,
                command,
                pidfd,
            } => {
                let status = launched.exit_status();
                vec![ProcessInfo {
                    exited: pidfd.has_exited() || status.is_some(),
                    ..info(launched.pid, command, status)
                }]
            }
            Scope::Binary { known, .. } => {
                let mut all = known.clone();
                for (pid, command) in seen {
                    all.entry(*pid).or_insert_with(|| command.clone());
                }
                all.iter().map(|(&pid, c)| info(pid, c, None)).collect()
            }
            Scope::SystemWide => seen.iter().map(|(&pid, c)| info(pid, c, None)).collect(),
        }
    }
}

/// Pids whose /proc/PID/exe is `path`.
fn running(path: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == path))
        .collect();
    pids.sort_unstable();
    pids
}

/// Gone, or a zombie.
fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
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
