//! The tracer under test: started with its arguments, read line by line,
//! stopped with SIGINT, and its JSON report read back.

use std::{
    ffi::OsStr,
    io::Read,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    thread::{self, JoinHandle},
};

use serde_json::Value;

use super::{read_json, require_root, scratch, wait_timeout, Lines, TRACER};

/// A running `memtrace-bpf`, killed on drop if still running.
pub struct Tracer {
    child: Child,
    pub stderr: Lines,
    stdout: Option<JoinHandle<String>>,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Tracer {
    /// Starts the tracer and waits until its probes are attached.
    pub fn start(args: &[&str]) -> Tracer {
        let mut t = Tracer::spawn(args);
        t.stderr.wait_for("memtrace-bpf: tracing ", "tracer attach");
        t
    }

    pub fn spawn(args: &[&str]) -> Tracer {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        Tracer::spawn_with(&args, true)
    }

    /// Starts the tracer with its default sampling rate (no --sample-rate).
    pub fn start_sampling(args: &[&str]) -> Tracer {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        let mut t = Tracer::spawn_with(&args, false);
        t.stderr.wait_for("memtrace-bpf: tracing ", "tracer attach");
        t
    }

    /// `spawn`, with `env` added to the tracer's environment.
    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Tracer {
        let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
        Tracer::spawn_with_env(&args, true, env)
    }

    fn spawn_with(args: &[&OsStr], exact: bool) -> Tracer {
        Tracer::spawn_with_env(args, exact, &[])
    }

    /// `spawn_with`, `env` added to the tracer's environment.
    fn spawn_with_env(args: &[&OsStr], exact: bool, env: &[(&str, &str)]) -> Tracer {
        let mut command = Command::new(TRACER);
        command.envs(env.iter().copied());
        // The defaults below go before the test's own arguments, which may
        // end with `-- CMD ...`.
        // Every allocation is recorded (exact mode) and the suite runs its
        // allocation-heavy targets in parallel on two cores, where the
        // tracer's reader gets little CPU: a bigger ring buffer keeps the
        // bursts (20000 DWARF samples in a few ms) from overflowing it.
        // Overflow is counted, and the tests check those counters are 0.
        if !args.iter().any(|a| *a == "--ringbuf-mb") {
            command.args(["--ringbuf-mb", "256"]);
        }
        // The tests check exact numbers unless they choose a sampling rate.
        if exact && !args.iter().any(|a| *a == "--sample-rate") {
            command.args(["--sample-rate", "1"]);
        }
        command.args(args);
        Tracer::spawn_command(command, Stdio::null())
    }

    /// Starts `command` as the tracer: a memtrace-bpf binary with all its
    /// arguments (none are added), or a wrapper that execs one (setpriv),
    /// with `stdin` (a command it starts inherits it).
    pub fn spawn_command(mut command: Command, stdin: Stdio) -> Tracer {
        require_root();
        // Its own process group, whose parent (this test) is in another
        // group of the same session: the group is never orphaned, however
        // the suite was started (from a session leader with no job control,
        // as CI runners and `setsid` do, it would be). The kernel discards
        // SIGTSTP, SIGTTIN and SIGTTOU sent to a process of an orphaned
        // group (POSIX), so a started command could not be stopped by them.
        command.process_group(0);
        let mut child = command
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memtrace-bpf");
        let mut out = child.stdout.take().expect("stdout piped");
        let stdout = thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        let stderr = Lines::new(child.stderr.take().expect("stderr piped"));
        Tracer {
            child,
            stderr,
            stdout: Some(stdout),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "signal tracer");
    }

    /// Waits for the tracer to exit by itself.
    pub fn finish(mut self) -> Finished {
        let status = wait_timeout(&mut self.child);
        let stderr = self.stderr.rest();
        let stdout = self
            .stdout
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tracer that writes its report as JSON to a scratch file: the
/// `--format json -o FILE` start, the stop and the reading of the report
/// that most tests share. Derefs to the `Tracer` (its stderr, `signal`).
pub struct JsonTracer {
    tracer: Tracer,
    path: PathBuf,
}

impl JsonTracer {
    /// `Tracer::start` (exact, waits for the attach) with `args` and a JSON
    /// report to the scratch file `TAG.json`.
    pub fn start<A: AsRef<OsStr>>(tag: &str, args: &[A]) -> JsonTracer {
        JsonTracer::launch(tag, args, true, true)
    }

    /// `start` at the default sampling rate (no --sample-rate).
    pub fn start_sampling<A: AsRef<OsStr>>(tag: &str, args: &[A]) -> JsonTracer {
        JsonTracer::launch(tag, args, false, true)
    }

    /// `Tracer::spawn` (exact, does not wait for the attach: for a command
    /// that may end first, or to watch the attach).
    pub fn spawn<A: AsRef<OsStr>>(tag: &str, args: &[A]) -> JsonTracer {
        JsonTracer::launch(tag, args, true, false)
    }

    /// `start` with `env` added to the tracer's environment.
    pub fn start_with_env<A: AsRef<OsStr>>(
        tag: &str,
        args: &[A],
        env: &[(&str, &str)],
    ) -> JsonTracer {
        JsonTracer::launch_env(tag, args, true, true, env)
    }

    fn launch<A: AsRef<OsStr>>(tag: &str, args: &[A], exact: bool, wait: bool) -> JsonTracer {
        JsonTracer::launch_env(tag, args, exact, wait, &[])
    }

    fn launch_env<A: AsRef<OsStr>>(
        tag: &str,
        args: &[A],
        exact: bool,
        wait: bool,
        env: &[(&str, &str)],
    ) -> JsonTracer {
        let path = scratch(&format!("{tag}.json"));
        // Before the test's arguments, which may end with `-- CMD ...`.
        let mut all: Vec<&OsStr> = ["--format", "json", "-o"].map(OsStr::new).to_vec();
        all.push(path.as_os_str());
        all.extend(args.iter().map(AsRef::as_ref));
        let mut tracer = Tracer::spawn_with_env(&all, exact, env);
        if wait {
            tracer
                .stderr
                .wait_for("memtrace-bpf: tracing ", "tracer attach");
        }
        JsonTracer { tracer, path }
    }

    /// Stops the tracer with SIGINT; see `finish`.
    pub fn stop(self) -> (Value, Finished) {
        self.stop_with(libc::SIGINT)
    }

    /// Stops the tracer with `sig`; see `finish`.
    pub fn stop_with(self, sig: libc::c_int) -> (Value, Finished) {
        self.tracer.signal(sig);
        self.finish()
    }

    /// Waits for the tracer to exit, asserts that it succeeded, and returns
    /// its report and output.
    pub fn finish(self) -> (Value, Finished) {
        let (out, path) = self.finish_unchecked();
        assert!(
            out.status.success(),
            "tracer failed ({:?}): {}",
            out.status,
            out.stderr
        );
        (read_json(&path), out)
    }

    /// Waits for the tracer to exit, whatever its status; returns its output
    /// and where its report is.
    pub fn finish_unchecked(self) -> (Finished, PathBuf) {
        (self.tracer.finish(), self.path)
    }
}

impl std::ops::Deref for JsonTracer {
    type Target = Tracer;
    fn deref(&self) -> &Tracer {
        &self.tracer
    }
}

impl std::ops::DerefMut for JsonTracer {
    fn deref_mut(&mut self) -> &mut Tracer {
        &mut self.tracer
    }
}
