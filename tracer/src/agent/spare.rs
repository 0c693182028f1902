//! The agent's standby tracer: one tracer process whose BPF programs are
//! loaded and verified ahead of the next trace (standby.rs), attached
//! nowhere. A trace asked for is given to it when it is ready, and starts
//! without the verifier's wait; otherwise the trace's own tracer loads its
//! programs as usual. The next standby tracer is started at the next
//! sweep, once the one given a trace was handed its command line.
//!
//! Bounded: one standby tracer at a time (its maps, about 40 MiB of kernel
//! memory, and its process), ended with the agent and none started after
//! it stops. Standby tracers that end before they are given a trace
//! `MAX_FAILURES` times in a row (a load the kernel refuses) are not
//! started again, and the agent says why.

use std::{
    ffi::OsString,
    fs,
    io::{Read as _, Write as _},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use super::standby;

/// Standby tracers that ended before they were ready, in a row, after
/// which no more are started.
const MAX_FAILURES: u32 = 3;

pub struct Spares {
    exe: PathBuf,
    dir: PathBuf,
    held: Option<Spare>,
    /// Standby tracers started so far (their logs' names).
    started: u64,
    failures: u32,
    /// Why no standby tracer is started any more.
    given_up: Option<String>,
    /// The agent stops: no more standby tracers.
    closed: bool,
}

struct Spare {
    child: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    log: PathBuf,
    ready: bool,
}

impl Spares {
    pub fn new(exe: PathBuf, dir: PathBuf) -> Spares {
        Spares {
            exe,
            dir,
            held: None,
            started: 0,
            failures: 0,
            given_up: None,
            closed: false,
        }
    }

    /// Starts a standby tracer when none is held; notes one that ended
    /// and one that became ready.
    pub fn refill(&mut self) {
        if let Some(spare) = &mut self.held {
            match spare.child.try_wait() {
                Ok(None) => {
                    if !spare.ready {
                        spare.ready = said_ready(&mut spare.stdout);
                    }
                    return;
                }
                _ => self.failed(),
            }
        }
        if self.given_up.is_some() || self.held.is_some() || self.closed {
            return;
        }
        self.started += 1;
        let log = self.dir.join(format!("standby-{}.stderr", self.started));
        match spawn(&self.exe, &log) {
            Ok(spare) => self.held = Some(spare),
            Err(e) => self.give_up(format!("starting a standby tracer: {e}")),
        }
    }

    /// The standby tracer, if its programs are loaded, given the trace of
    /// `args` (the tracer's arguments after its name); its log becomes
    /// `log`. None when no tracer is ready or the arguments are no text.
    pub fn take(&mut self, args: &[OsString], log: &Path) -> Option<Child> {
        let spare = self.held.as_mut()?;
        if !spare.ready {
            spare.ready = said_ready(&mut spare.stdout);
        }
        if !spare.ready {
            return None;
        }
        let mut line: Vec<&str> = vec!["memtrace-bpf"];
        for a in args {
            line.push(a.to_str()?);
        }
        let mut text = serde_json::to_vec(&line).ok()?;
        text.push(b'\n');
        if text.len() > standby::MAX_LINE {
            return None;
        }
        let mut spare = self.held.take()?;
        if spare.stdin.write_all(&text).is_err() || fs::rename(&spare.log, log).is_err() {
            // It ended (or its log is gone): the trace gets a tracer of
            // its own, and this one counts as a failure.
            let _ = spare.child.kill();
            self.held = Some(spare);
            self.failed();
            return None;
        }
        self.failures = 0;
        Some(spare.child)
    }

    /// "ready", "loading", "starting" (at the next sweep), or "none: "
    /// and why no more are started.
    pub fn state(&self) -> String {
        match (&self.held, &self.given_up) {
            (Some(spare), _) if spare.ready => "ready".into(),
            (Some(_), _) => "loading".into(),
            (None, Some(why)) => format!("none: {why}"),
            (None, None) => "starting".into(),
        }
    }

    /// The standby tracer's pid, while one is held.
    pub fn pid(&self) -> Option<u32> {
        self.held.as_ref().map(|spare| spare.child.id())
    }

    /// Ends the standby tracer (nothing is attached in it); no other is
    /// started after.
    pub fn stop(&mut self) {
        self.closed = true;
        if let Some(mut spare) = self.held.take() {
            let _ = spare.child.kill();
            let _ = spare.child.wait();
            let _ = fs::remove_file(&spare.log);
        }
    }

    fn failed(&mut self) {
        let Some(mut spare) = self.held.take() else {
            return;
        };
        let _ = spare.child.wait();
        let why = super::log_tail::tail_of(&spare.log);
        let _ = fs::remove_file(&spare.log);
        self.failures += 1;
        if self.failures >= MAX_FAILURES {
            self.give_up(why);
        }
    }

    fn give_up(&mut self, why: String) {
        crate::console::say(format_args!(
            "no tracer is kept loaded ahead of the traces (each trace loads its own \
             programs): {why}"
        ));
        self.given_up = Some(why);
    }
}

fn spawn(exe: &Path, log: &Path) -> std::io::Result<Spare> {
    let stderr = fs::File::create(log)?;
    let mut command = Command::new(exe);
    command
        .arg(standby::WORD)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr);
    super::child::ends_with_the_agent(&mut command);
    let mut child = command.spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(std::io::Error::other("no pipes to the standby tracer"));
    };
    // SAFETY: fcntl on a pipe this process owns.
    unsafe {
        let fd = stdout.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok(Spare {
        child,
        stdin,
        stdout,
        log: log.to_path_buf(),
        ready: false,
    })
}

/// The standby tracer wrote its ready line (a non-blocking read).
fn said_ready(stdout: &mut ChildStdout) -> bool {
    let mut buf = [0u8; 64];
    match stdout.read(&mut buf) {
        Ok(n) => buf[..n]
            .split(|&b| b == b'\n')
            .any(|l| l == standby::READY.as_bytes()),
        Err(_) => false,
    }
}
