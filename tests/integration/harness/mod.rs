//! Running target programs and the tracer, with timeouts so nothing hangs.

use std::{
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver},
    thread::{self, JoinHandle},
    time::Duration,
};

pub mod agent;
pub mod cgroup;
pub mod chromium;
pub mod hostile;
pub mod http;
pub mod offline;
pub mod otlp;
pub mod pprof;
pub mod process;
mod report;
pub mod rjem;
pub mod sites;
pub mod tokio_big;
mod tracer;

pub use report::{
    function_names, inuse_from, parse_report, pids, process_entry, read_json, saved_elsewhere,
};
pub use tracer::{Finished, JsonTracer, Tracer};

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
pub fn target_source(file: &str) -> PathBuf {
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
    compile_rust_as(name, name, flags)
}

/// Compiles tests/targets/NAME.rs with `flags` into a binary named `tag`
/// (so builds with other flags do not replace one a test is running).
pub fn compile_rust_as(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    require_root();
    let src = target_source(&format!("{name}.rs"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(tag);
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
    pub fn new(pipe: impl Read + Send + 'static) -> Lines {
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
    /// One deadline for the whole wait: a child that keeps printing other
    /// lines (a --verbose tracer's stats) does not hold it for ever.
    pub fn wait_for(&mut self, needle: &str, what: &str) -> String {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
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
