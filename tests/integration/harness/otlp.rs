//! A loopback OTLP receiver (harness/otlp_receiver.py, run by the venv's
//! python with the official `opentelemetry-proto` package) and what it
//! decoded.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
};

use serde_json::Value;

use super::{scratch, Lines};

/// The venv `cargo xtask setup` makes under target/.
fn venv_python() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is target/tmp");
    let python = target.join("otlp-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs opentelemetry-proto from PyPI \
         into target/otlp-venv)",
        python.display()
    );
    python
}

/// A running receiver, stopped on drop (its stdin closed, then killed).
pub struct Receiver {
    child: Child,
    stdin: Option<ChildStdin>,
    pub stdout: Lines,
    pub port: u16,
    dir: PathBuf,
}

impl Receiver {
    /// Starts a receiver that answers 503 to its first `refuse` requests;
    /// its decoded requests go to the scratch directory `tag`.
    pub fn start(tag: &str, refuse: u32) -> Receiver {
        let dir = scratch(tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("receiver output directory");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/integration/harness/otlp_receiver.py");
        let mut child = Command::new(venv_python())
            .arg(script)
            .arg(&dir)
            .arg(refuse.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the OTLP receiver");
        let stdin = child.stdin.take();
        let mut stdout = Lines::new(child.stdout.take().expect("stdout piped"));
        let line = stdout.wait_for("listening ", "OTLP receiver start");
        let port = line
            .trim_start_matches("listening ")
            .trim()
            .parse()
            .expect("the receiver's port");
        Receiver {
            child,
            stdin,
            stdout,
            port,
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Request `n` as decoded (1 is the first accepted).
    pub fn request(&self, n: u64) -> Value {
        let path = self.dir.join(format!("request-{n}.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("the receiver writes JSON")
    }

    /// How many requests were accepted (all lines it printed so far
    /// included: call after the tracer exited).
    pub fn accepted(&mut self) -> u64 {
        std::fs::read_dir(&self.dir)
            .expect("receiver output directory")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .count() as u64
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.flush();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
