//! Running target programs and the tracer, with timeouts so nothing hangs.

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Read, Write},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver},
    thread::{self, JoinHandle},
    time::Duration,
};

use serde_json::Value;

use crate::sites::read_json;

pub const TRACER: &str = env!("CARGO_BIN_EXE_memtrace-bpf");
const TIMEOUT: Duration = Duration::from_secs(60);

/// The integration tests load BPF programs and need root. The runner
/// (`cargo xtask test`, which CI runs) checks that once before it starts
/// them; this stops a direct `cargo test` without root at its first test
/// with the reason, instead of a failure per test. Nothing is skipped.
fn require_root() {
    static CHECKED: std::sync::Once = std::sync::Once::new();
    CHECKED.call_once(|| {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            root,
            "the integration tests load BPF programs and need root: run `cargo xtask test` as root"
        );
    });
}

/// tests/targets/FILE.
fn target_source(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/targets")
        .join(file)
}

/// Compiles tests/targets/NAME.c with `flags` into a binary unique to `tag`.
pub fn compile_c(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    require_root();
    let src = target_source(&format!("{name}.c"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{tag}"));
    // Tests running in parallel compile the same program: each writes its
    // own file and renames it into place, so none ever runs (or finds not
    // executable) a file another is still writing.
    let tmp = out.with_extension(format!(
        "tmp-{}-{:?}",
        std::process::id(),
        thread::current().id()
    ));
    let status = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-pthread")
        .status()
        .expect("run cc (install gcc: cargo xtask setup)");
    assert!(status.success(), "compiling {} failed", src.display());
    std::fs::rename(&tmp, &out).expect("rename the compiled program into place");
    out
}

/// Compiles tests/targets/NAME.rs (std only) with `rustc --edition 2021` and
/// `flags` into CARGO_TARGET_TMPDIR/NAME.
pub fn compile_rust(name: &str, flags: &[&str]) -> PathBuf {
    require_root();
    let src = target_source(&format!("{name}.rs"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let status = Command::new(toolchain_binary("rustc"))
        .args(["--edition", "2021"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run rustc");
    assert!(status.success(), "compiling {} failed", src.display());
    out
}

/// A toolchain program (`rustc`, `cargo`): the one cargo names in the
/// environment (CARGO, RUSTC) when running the tests, else the one on PATH,
/// else rustup's ~/.cargo/bin.
pub fn toolchain_binary(name: &str) -> PathBuf {
    if let Some(named) = std::env::var_os(name.to_uppercase()) {
        return named.into();
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    on_path
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo/bin").join(name))
        })
        .unwrap_or_else(|| panic!("{name} on PATH or HOME set (for ~/.cargo/bin/{name})"))
}

/// Lines of a child's pipe, delivered through a channel by a thread.
pub struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
    _thread: JoinHandle<()>,
}

impl Lines {
    fn new(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        let thread = thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
            _thread: thread,
        }
    }

    /// Waits for a line containing `needle`; panics with what was seen.
    pub fn wait_for(&mut self, needle: &str, what: &str) -> String {
        loop {
            match self.rx.recv_timeout(TIMEOUT) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "{what}: no line containing {needle:?} within {TIMEOUT:?}; saw:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Everything up to end of stream.
    pub fn rest(&mut self) -> String {
        while let Ok(line) = self.rx.recv_timeout(TIMEOUT) {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}

/// A compiled target program, killed on drop.
pub struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines,
}

impl Target {
    /// Starts `bin` and waits until it prints "ready".
    pub fn start(bin: &Path, args: &[&str]) -> Target {
        Target::start_with_env(bin, args, &[])
    }

    /// Starts `bin` with extra environment variables (e.g. LD_PRELOAD).
    pub fn start_with_env(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Target {
        let mut child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdin = child.stdin.take();
        let stdout = Lines::new(child.stdout.take().expect("stdout piped"));
        let mut t = Target {
            child,
            stdin,
            stdout,
        };
        t.stdout.wait_for("ready", "target start");
        t
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` and a newline to the target's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("target stdin open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .expect("write to target");
        stdin.flush().expect("flush target stdin");
    }

    /// Waits for a line of the target's output containing `needle`.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.stdout.wait_for(needle, "target output")
    }

    /// Lets the target run its allocations and waits until it is done.
    pub fn run_sites(&mut self) {
        let stdin = self.stdin.as_mut().expect("target stdin open");
        stdin.write_all(b"go\n").expect("write to target");
        stdin.flush().expect("flush target stdin");
        self.stdout.wait_for("done", "target sites");
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        self.child.wait().expect("wait for target")
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

    fn spawn_with(args: &[&OsStr], exact: bool) -> Tracer {
        require_root();
        let mut command = Command::new(TRACER);
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
        // Its own process group, whose parent (this test) is in another
        // group of the same session: the group is never orphaned, however
        // the suite was started (from a session leader with no job control,
        // as CI runners and `setsid` do, it would be). The kernel discards
        // SIGTSTP, SIGTTIN and SIGTTOU sent to a process of an orphaned
        // group (POSIX), so a started command could not be stopped by them.
        command.process_group(0);
        let mut child = command
            .stdin(Stdio::null())
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

    fn launch<A: AsRef<OsStr>>(tag: &str, args: &[A], exact: bool, wait: bool) -> JsonTracer {
        let path = scratch(&format!("{tag}.json"));
        // Before the test's arguments, which may end with `-- CMD ...`.
        let mut all: Vec<&OsStr> = ["--format", "json", "-o"].map(OsStr::new).to_vec();
        all.push(path.as_os_str());
        all.extend(args.iter().map(AsRef::as_ref));
        let mut tracer = Tracer::spawn_with(&all, exact);
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

fn wait_timeout(child: &mut Child) -> ExitStatus {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().expect("wait for tracer") {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tracer did not exit within {TIMEOUT:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Held by each system-wide test for its whole run: concurrent system-wide
/// tracers hook every process, each other included, and each attach and
/// detach waits on the others (three at once took two minutes instead of
/// ten seconds). A lock file, not a mutex: test runs of other checkouts on
/// the same machine take it too.
pub fn system_wide_lock() -> SystemWideLock {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/memtrace-bpf-system-wide-tests.lock")
        .expect("open the system-wide tests' lock file");
    // SAFETY: flock on a descriptor this function owns; the lock goes when
    // the file is closed (the guard is dropped, or the test process dies).
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    SystemWideLock { _file: file }
}

/// Released when dropped (the lock file is closed).
pub struct SystemWideLock {
    _file: std::fs::File,
}

/// A scratch file path unique to `tag`.
pub fn scratch(tag: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(tag)
}
