//! `memtrace-bpf -- CMD ARGS`: start CMD held, so that the probes are
//! attached before its first instruction runs, then release it.
//!
//! The child is forked and waits on a pipe before it execs; uprobes are
//! registered on the libc file for its pid, and the kernel puts them into
//! the libc mapping that the dynamic loader creates after exec. std's
//! `Command::spawn` cannot be used: it waits for the exec to happen.
//!
//! The child is also ptrace-seized with PTRACE_O_TRACEEXIT and
//! PTRACE_O_TRACEEXEC (signals pass through): at its exit it stops while
//! its memory map still exists, the tracer reads the map and handles the
//! child's last events, then lets it go. At each exec it stops before the
//! new image's first instruction (the dynamic loader has not run yet): a
//! command that execs into a chroot or another mount namespace (`chroot
//! ROOT PROG`, `unshare -m ...`) loads other files than the ones hooked
//! before it started, and those are hooked there, before they run. A command that runs for less than
//! the ring buffer's drain interval is named like any other. Job control
//! keeps working: a group stop (SIGSTOP, SIGTSTP, ...) is left in force
//! with PTRACE_LISTEN, and the trap the kernel reports at SIGCONT resumes
//! the command (ptrace(2), "Group-stop").
//!
//! The command line is bytes (`OsString`): it reaches execv unchanged, and
//! is only escaped for display.

use std::{
    ffi::{CString, OsString},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::PathBuf,
};

use anyhow::Context as _;

use super::entry_stop::EntryBreak;

mod command;

use command::find_program;
pub use command::{check_dynamic, display_command, report_command};

/// A started, still held command.
pub struct Launched {
    pub pid: u32,
    pub path: PathBuf,
    go: Option<OwnedFd>,
    /// Ptrace-attached (PTRACE_SEIZE) so that its exit stops it while its
    /// memory map still exists: a command that allocates and exits within
    /// one drain of the ring buffer still gets its maps read and its frames
    /// named. False when the kernel refused (the trace goes on without).
    held_at_exit: bool,
    /// The wait status, once reaped.
    status: Option<i32>,
    /// A breakpoint at the current image's entry point, not hit yet
    /// (`entry_stop.rs`).
    entry: Option<EntryBreak>,
}

impl Launched {
    /// Forks; the child execs `args` once `release` is called.
    pub fn spawn(args: &[OsString]) -> anyhow::Result<Launched> {
        let program = args.first().context("no command given after --")?;
        let path = find_program(program)?;
        check_dynamic(&path)?;
        let c_path = CString::new(path.as_os_str().as_bytes()).context("command path")?;
        let c_args: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("command arguments")?;
        let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let (wait_end, go_end) = pipe()?;
        let (ready_end, readied_end) = pipe()?;
        // SAFETY: the tracer is single-threaded here (its runtime runs on this
        // thread and has spawned none); the child only calls close, prctl,
        // write, read, execv and _exit, all safe after fork, on memory
        // prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("fork");
        }
        if pid == 0 {
            // SAFETY: see above; the child never returns from this block.
            unsafe {
                let mut byte = 0u8;
                libc::close(go_end.as_raw_fd());
                libc::close(ready_end.as_raw_fd());
                // A tracer run with file capabilities is not dumpable, nor
                // is this fork of it until it execs: without this, its own
                // user's tracer could not ptrace it (PTRACE_SEIZE: EPERM).
                libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
                libc::write(readied_end.as_raw_fd(), b"r".as_ptr().cast(), 1);
                libc::close(readied_end.as_raw_fd());
                if libc::read(wait_end.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) == 1 {
                    libc::execv(c_path.as_ptr(), argv.as_ptr());
                }
                libc::_exit(127);
            }
        }
        drop(wait_end);
        drop(readied_end);
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local from our own pipe; it returns
        // once the child made itself dumpable (or 0 if it died).
        unsafe { libc::read(ready_end.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) };
        // SAFETY: ptrace on our own child, which is blocked in read().
        let held_at_exit = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                pid,
                std::ptr::null_mut::<libc::c_void>(),
                (libc::PTRACE_O_TRACEEXIT | libc::PTRACE_O_TRACEEXEC) as usize as *mut libc::c_void,
            )
        } == 0;
        Ok(Launched {
            pid: pid as u32,
            path,
            go: Some(go_end),
            held_at_exit,
            status: None,
            entry: None,
        })
    }

    /// Handles the command's ptrace stops (call on SIGCHLD): at its exit
    /// stop, `at_exit` runs while its memory map can still be read, then it
    /// is let go; at an exec stop, `at_exec` runs before the new image does,
    /// and if it returns true the command stops again at its entry point
    /// (its libraries mapped, `main` not yet run), where `at_entry` runs;
    /// a signal is passed on; a group stop is left to take effect. Also
    /// reaps it once it ended.
    pub fn service(
        &mut self,
        mut at_exit: impl FnMut(),
        mut at_exec: impl FnMut() -> bool,
        mut at_entry: impl FnMut(),
    ) {
        loop {
            let Some(status) = self.try_wait() else {
                return;
            };
            if !libc::WIFSTOPPED(status) {
                self.status = Some(status);
                return;
            }
            let pid = self.pid as libc::pid_t;
            let event = (status >> 16) & 0xff;
            let null = std::ptr::null_mut::<libc::c_void>();
            // SAFETY: ptrace requests on our own stopped tracee.
            unsafe {
                if event == libc::PTRACE_EVENT_EXIT {
                    at_exit();
                    libc::ptrace(libc::PTRACE_DETACH, pid, null, null);
                } else if event == libc::PTRACE_EVENT_EXEC {
                    // The old image, and any breakpoint in it, is gone.
                    self.entry = None;
                    if at_exec() {
                        self.entry = EntryBreak::set(pid);
                    }
                    libc::ptrace(libc::PTRACE_CONT, pid, null, null);
                } else if event == libc::PTRACE_EVENT_STOP {
                    if is_group_stop(libc::WSTOPSIG(status)) {
                        // Stays stopped, and the tracer hears of SIGCONT.
                        libc::ptrace(libc::PTRACE_LISTEN, pid, null, null);
                    } else {
                        // SIGTRAP: the SIGCONT notification (or an
                        // interrupt): the stop is over, it must run.
                        libc::ptrace(libc::PTRACE_CONT, pid, null, null);
                    }
                } else if libc::WSTOPSIG(status) == libc::SIGTRAP
                    && self.entry.is_some_and(|b| b.hit(pid))
                {
                    self.entry = None;
                    at_entry();
                    libc::ptrace(libc::PTRACE_CONT, pid, null, null);
                } else {
                    let sig = libc::WSTOPSIG(status) as usize as *mut libc::c_void;
                    libc::ptrace(libc::PTRACE_CONT, pid, null, sig);
                }
            }
        }
    }

    /// The child's next wait status (a stop or its end), without blocking.
    fn try_wait(&self) -> Option<i32> {
        let mut status = 0;
        // SAFETY: waits for our own child; WNOHANG never blocks.
        let rc = unsafe {
            libc::waitpid(
                self.pid as libc::pid_t,
                &mut status,
                libc::WNOHANG | libc::__WALL,
            )
        };
        (rc == self.pid as libc::pid_t).then_some(status)
    }

    /// Stops holding the command (at the end of the trace): it runs on
    /// untraced, with any stop it was in handled first.
    pub fn let_go(&mut self) {
        if !self.held_at_exit {
            return;
        }
        self.held_at_exit = false;
        self.service(|| {}, || false, || {});
        let pid = self.pid as libc::pid_t;
        let null = std::ptr::null_mut::<libc::c_void>();
        // SAFETY: ptrace requests on our own tracee; they fail harmlessly
        // (ESRCH) when it has already exited or been detached.
        unsafe {
            if libc::ptrace(libc::PTRACE_INTERRUPT, pid, null, null) != 0 {
                return;
            }
            let mut status = 0;
            if libc::waitpid(pid, &mut status, libc::__WALL) != pid {
                return;
            }
            if !libc::WIFSTOPPED(status) {
                self.status = Some(status);
                return;
            }
            // Not at its entry point yet: the program's first instruction
            // goes back in place before it runs untraced.
            if let Some(entry) = self.entry.take() {
                entry.remove(pid);
            }
            let event = (status >> 16) & 0xff;
            // A signal it was stopped for is delivered on the way out.
            let sig = if event == 0 {
                libc::WSTOPSIG(status)
            } else {
                0
            };
            libc::ptrace(
                libc::PTRACE_DETACH,
                pid,
                null,
                sig as usize as *mut libc::c_void,
            );
        }
    }

    /// Lets the child exec the command.
    pub fn release(&mut self) -> anyhow::Result<()> {
        if let Some(go) = self.go.take() {
            // SAFETY: writes one byte from a local to our own pipe.
            let n = unsafe { libc::write(go.as_raw_fd(), b"g".as_ptr().cast(), 1) };
            if n != 1 {
                return Err(std::io::Error::last_os_error()).context("releasing the command");
            }
        }
        Ok(())
    }

    /// Sends `sig` to the command, unless it was already reaped (its pid
    /// may then belong to another process).
    pub fn signal(&self, sig: libc::c_int) {
        if self.status.is_none() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    /// Whether it has ended (and was reaped by `service`).
    pub fn has_ended(&self) -> bool {
        self.status.is_some()
    }

    /// The exit code a shell would give for it: its status, or 128 + the
    /// signal that killed it. None while it runs.
    pub fn shell_status(&self) -> Option<u8> {
        let status = self.wait_status()?;
        if libc::WIFEXITED(status) {
            Some(libc::WEXITSTATUS(status) as u8)
        } else if libc::WIFSIGNALED(status) {
            Some(128u8.wrapping_add(libc::WTERMSIG(status) as u8))
        } else {
            None
        }
    }

    /// Its wait status once it ended, as `service` (the one caller of
    /// waitpid) reaped it. Waiting here would consume the report of a
    /// ptrace stop (a signal-delivery stop, the exit stop) that only
    /// `service` may answer: the command would stay stopped for good, its
    /// SIGTERM never delivered.
    fn wait_status(&self) -> Option<i32> {
        self.status
    }

    /// Describes how the command ended, if `service` saw it end.
    pub fn exit_status(&self) -> Option<String> {
        let status = self.wait_status()?;
        Some(if libc::WIFEXITED(status) {
            format!("exited with status {}", libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            format!("killed by signal {}", libc::WTERMSIG(status))
        } else {
            format!("ended with wait status {status}")
        })
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        // Not released (tracing failed): the child exits without running.
        self.go.take();
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating a pipe");
    }
    // SAFETY: both fds are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU: the signals of a group stop, as
/// WSTOPSIG reports them for PTRACE_EVENT_STOP (other stops give SIGTRAP).
fn is_group_stop(sig: libc::c_int) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stopping_signals_are_group_stops() {
        for sig in [libc::SIGSTOP, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
            assert!(is_group_stop(sig), "{sig}");
        }
        assert!(!is_group_stop(libc::SIGTRAP));
        assert!(!is_group_stop(libc::SIGCONT));
    }
}
