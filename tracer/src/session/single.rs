//! `--pid PID` and `-- CMD`: one process (with --follow-forks, and the
//! processes it forks), whose exit ends the trace. A command is started by
//! memtrace-bpf, held until the probes are attached and at its exit.

use std::ffi::OsString;

use crate::collect::{Exec, ProcessChange};
use crate::{
    console,
    error::TraceError,
    escape,
    probes::{hooks::Hooks, loader::Loaded},
    report::{Note, ProcessInfo},
    session::forks::Forks,
    tracee::{
        launch::Launched,
        liveness::PidFd,
        process::{read_cmdline, Process},
        search::Program,
    },
};

/// How many times `--pid` reads the process's image before it falls back
/// to the loader's rules (see `Single::hook_current_image`).
const IMAGE_ATTEMPTS: usize = 3;

pub struct Single {
    pub pid: u32,
    /// Opened before attaching, so a reused pid cannot fool the exit check.
    pub pidfd: PidFd,
    /// Its command line as the report shows it (lossy UTF-8, escaped by
    /// each renderer).
    command: String,
    pub forks: Forks,
    /// `-- CMD`: the command started, and its argv with its exact bytes
    /// escaped, for stderr.
    launched: Option<(Launched, String)>,
    /// Its execs from a thread other than its main one (see `on_exec`).
    execs_from_threads: u64,
}

impl Single {
    /// Started by the tracer (`-- CMD`), not attached to (`--pid`).
    pub fn is_launched(&self) -> bool {
        self.launched.is_some()
    }

    /// `--pid`: the process as it is now (its maps are read once its
    /// probes are attached: see `begin`).
    /// `keep_exited`: --exited-processes, how many exited children keep
    /// their own entry (see `Forks`).
    pub fn attach_to(pid: u32, follow_forks: bool, keep_exited: usize) -> anyhow::Result<Single> {
        let process = Process::inspect(pid)?;
        let pidfd = PidFd::open(pid)?;
        Ok(Single {
            pid,
            pidfd,
            command: process.command,
            forks: Forks::new(follow_forks, keep_exited),
            launched: None,
            execs_from_threads: 0,
        })
    }

    /// `-- CMD`: started, held before its first instruction.
    pub fn start(
        command: &[OsString],
        follow_forks: bool,
        keep_exited: usize,
    ) -> anyhow::Result<Single> {
        let launched = Launched::spawn(command)?;
        let pidfd = PidFd::open(launched.pid)?;
        let argv_shown = crate::tracee::launch::display_command(command);
        Ok(Single {
            pid: launched.pid,
            pidfd,
            command: crate::tracee::launch::report_command(command),
            forks: Forks::new(follow_forks, keep_exited),
            launched: Some((launched, argv_shown)),
            execs_from_threads: 0,
        })
    }

    /// Attaches its allocators (for a command, those of the program as the
    /// loader will load it); with --follow-forks, its descendants' too.
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        let pid = self.pid;
        // Probes on its objects only for it, unless its children follow.
        let attach_pid = (!self.forks.follow).then_some(pid);
        if let Some((launched, _)) = &self.launched {
            loaded.add_filtered_pid(pid)?;
            let program = Program::to_start(&launched.path);
            return hooks.hook(loaded, &program, Some(pid), attach_pid);
        }
        let result = loaded
            .add_filtered_pid(pid)
            .and_then(|()| self.hook_current_image(loaded, hooks, attach_pid));
        match result {
            // perf_event_open fails with ESRCH, or /proc/PID is gone: say
            // what happened.
            Err(e) if self.pidfd.has_exited() || is_gone(&e) => {
                return Err(TraceError::ExitedBeforeAttach(pid).into())
            }
            r => r?,
        }
        if self.forks.follow {
            follow_descendants(pid, &mut self.forks, loaded, hooks);
        }
        Ok(())
    }

    /// `--pid`: hooks the allocators of the image the process runs now.
    /// An exec meanwhile fails an attempt (the /proc/PID/map_files/...
    /// entries read vanish with the old image, and a new image's maps
    /// lack its libraries until its loader maps them): the next attempt
    /// reads the new image. Its pid is in the filter already, so an exec
    /// after the last read is an event, handled as the trace runs. If the
    /// attempts keep meeting execs, the loader's rules say what the image
    /// loads, as for a process met during the trace.
    fn hook_current_image(
        &self,
        loaded: &mut Loaded,
        hooks: &mut Hooks,
        attach_pid: Option<u32>,
    ) -> anyhow::Result<()> {
        let pid = self.pid;
        let mut first_error = None;
        for _ in 0..IMAGE_ATTEMPTS {
            let attempt = Program::running(pid)
                .map_err(anyhow::Error::from)
                .and_then(|program| hooks.hook(loaded, &program, Some(pid), attach_pid));
            match attempt {
                Ok(()) => return Ok(()),
                Err(e) if self.pidfd.has_exited() || is_gone(&e) => return Err(e),
                Err(e) => first_error = first_error.or(Some(e)),
            }
        }
        let by_loader = Program::just_executed(pid)
            .map_err(anyhow::Error::from)
            .and_then(|program| hooks.hook(loaded, &program, Some(pid), attach_pid));
        match (by_loader, first_error) {
            (Ok(()), _) => Ok(()),
            // What its running image showed says more than the loader's
            // rules: the error of the first attempt.
            (Err(_), Some(e)) => Err(e),
            (Err(e), None) => Err(e),
        }
    }

    /// After the probes are attached: a held command runs; a pid may have
    /// exited meanwhile. Returns the processes whose maps to read now:
    /// an attached pid's, read once it is in the filter, so that any
    /// exec after the read comes as an event (a read before could be of
    /// an image it has left).
    pub fn begin(&mut self) -> anyhow::Result<Vec<u32>> {
        match &mut self.launched {
            Some((launched, _)) => launched.release().map(|()| Vec::new()),
            None if self.pidfd.has_exited() => Err(TraceError::ExitedBeforeAttach(self.pid).into()),
            None => Ok(vec![self.pid]),
        }
    }

    /// A process called exec: hook what its new image uses.
    ///
    /// The probes of the traced process alone (no --follow-forks) are
    /// bound to its main task: those on files its new image does not map
    /// are detached, and after an exec from another thread, whose task
    /// the process now is, all are attached again for it (what the new
    /// image allocated until then is not seen: said on stderr and in the
    /// report).
    pub fn on_exec(&mut self, exec: Exec, loaded: &mut Loaded, hooks: &mut Hooks) {
        let pid = exec.pid;
        if pid == self.pid {
            let now = read_cmdline(pid);
            // Kept as it was (the kernel's name for the new image, see
            // on_process_changes) if it already exited.
            if !now.is_empty() {
                self.command = now;
            }
            let alone = !self.forks.follow;
            let rebind = alone && exec.from_thread;
            if rebind {
                self.execs_from_threads += 1;
                hooks.detach_all(loaded);
            }
            let attach_pid = alone.then_some(pid);
            hooks.hook_running(loaded, pid, Program::just_executed(pid), attach_pid);
            if alone {
                hooks.detach_unused(loaded, pid);
            }
            if rebind {
                console::warn(format_args!(
                    "pid {pid} exec'ed from a thread other than its main one: its probes were \
                     attached again for its new image, whose allocations until then are not seen"
                ));
            }
        } else if self.forks.executed(pid) {
            // A followed child's new image may bring another allocator.
            hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
            // One that exited while it was read (a shell's `true`) had
            // nothing left to hook.
            hooks.drop_vanished(Some(pid));
        }
    }

    /// --follow-forks: processes joined (in the kernel, at fork) or left
    /// the traced set.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        let root = self.pid;
        for change in changes {
            match change {
                ProcessChange::Forked { child, parent } => {
                    let parent_command = if parent == root {
                        self.command.clone()
                    } else {
                        self.forks.command(parent).unwrap_or_default().to_string()
                    };
                    self.forks.forked(child, &parent_command);
                }
                ProcessChange::Executed { pid, comm } if pid == root => {
                    // Gone already (a command that ran for a moment): the
                    // name the kernel gave its new image, unless the
                    // command known names that program (`-- CMD`).
                    if read_cmdline(pid).is_empty() && !runs(&self.command, &comm) {
                        self.command = comm;
                    }
                }
                ProcessChange::Executed { pid, comm } => self.forks.renamed(pid, &comm),
                ProcessChange::Exited { pid } => self.forks.exited(pid),
            }
        }
    }

    /// What the report says of the process itself.
    pub fn notes(&self) -> Vec<Note> {
        match self.execs_from_threads {
            0 => Vec::new(),
            execs => vec![Note::ExecsFromThreads {
                pid: self.pid,
                execs,
            }],
        }
    }

    /// The program of a started command.
    pub fn command_path(&self) -> Option<&std::path::Path> {
        self.launched.as_ref().map(|(l, _)| l.path.as_path())
    }

    pub fn label(&self) -> String {
        match &self.launched {
            Some((_, argv_shown)) => format!("pid {} ({argv_shown})", self.pid),
            None => format!("pid {} ({})", self.pid, escape::text(&self.command)),
        }
    }

    pub fn target(&self) -> String {
        match &self.launched {
            Some((launched, _)) => format!("command {}", launched.path.display()),
            None => format!("pid {}", self.pid),
        }
    }

    /// Puts the process first in the report's list (adding it if no event
    /// came from it), as the scope knows it, then its children.
    pub fn merge_processes(&mut self, all: &mut Vec<ProcessInfo>) {
        let root = root_first(all, self.pid);
        match &mut self.launched {
            Some((launched, _)) => {
                let status = launched.exit_status();
                root.command.clone_from(&self.command);
                // The file started, whole even with spaces in its path.
                root.program = launched.path.to_string_lossy().into_owned();
                root.exited = self.pidfd.has_exited() || status.is_some();
                root.exit_status = status;
            }
            None => {
                if !self.command.is_empty() {
                    root.command.clone_from(&self.command);
                }
                root.exited = self.pidfd.has_exited();
            }
        }
        self.forks.merge_processes(all);
    }

    /// The started command, if any.
    pub fn launched(&mut self) -> Option<&mut Launched> {
        self.launched.as_mut().map(|(launched, _)| launched)
    }
}

/// Moves the first process with pid `root` (traced from the start, it is
/// the oldest) to the front of `all`, adding it when no event came from
/// it, and returns it.
fn root_first(all: &mut Vec<ProcessInfo>, root: u32) -> &mut ProcessInfo {
    let entry = match all.iter().position(|p| p.pid == root) {
        Some(i) => all.remove(i),
        None => super::facts::process_info(root, String::new(), false),
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

/// --pid --follow-forks: the target's descendants running now join the
/// traced set (those forked from now on join in the kernel), each with
/// its allocators hooked.
fn follow_descendants(root: u32, forks: &mut Forks, loaded: &mut Loaded, hooks: &mut Hooks) {
    for (pid, _parent) in Forks::descendants(root) {
        if loaded.add_filtered_pid(pid).is_err() {
            hooks.add_failure(pid, "the process filter map is full".into());
            continue;
        }
        forks.forked(pid, "");
        hooks.hook_running(loaded, pid, Program::running(pid), None);
    }
}

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

#[cfg(test)]
mod tests {
    use super::runs;

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
