//! `memtrace-bpf agent` run by a test: on its own socket and a free
//! loopback port, asked over its API, stopped when dropped.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use memtrace_bpf::agent::client::{request, Address};
use serde_json::Value;

use super::{scratch, Lines, TRACER};

/// A running agent on its own socket and a free loopback port; stopped
/// (SIGTERM) when dropped.
pub(crate) struct Agent {
    pub(crate) child: Child,
    pub(crate) socket: PathBuf,
    pub(crate) tcp: String,
    pub(crate) dir: PathBuf,
    pub(crate) reports: PathBuf,
    /// Kept open: the agent's stderr is a pipe it writes to.
    _stderr: Lines,
}

impl Agent {
    pub(crate) fn start(tag: &str) -> Agent {
        Agent::start_with(tag, &[])
    }

    /// With `extra` arguments (triggers).
    pub(crate) fn start_with(tag: &str, extra: &[&str]) -> Agent {
        let base = scratch(&format!("agent-{tag}"));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("scratch dir");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755))
            .expect("scratch dir mode");
        let (socket, dir) = (base.join("run/agent.sock"), base.join("traces"));
        let reports = base.join("reports");
        let mut child = Command::new(TRACER)
            .arg("agent")
            .args(["--serve", "127.0.0.1:0", "--max-traces", "3"])
            .arg("--socket")
            .arg(&socket)
            .arg("--dir")
            .arg(&dir)
            .arg("--reports")
            .arg(&reports)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let mut stderr = Lines::new(child.stderr.take().expect("stderr piped"));
        let ready = stderr.wait_for("agent ready: http://", "agent start");
        let tcp = ready
            .split("http://")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .expect("the agent's address")
            .to_string();
        Agent {
            child,
            socket,
            tcp,
            dir,
            reports,
            _stderr: stderr,
        }
    }

    pub(crate) fn unix(&self) -> Address {
        Address::Unix(self.socket.clone())
    }

    pub(crate) fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, raw) = request(&self.unix(), method, path, body.map(str::as_bytes))
            .expect("the agent answers");
        let value = serde_json::from_slice(&raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
        (status, value)
    }

    pub(crate) fn post(&self, body: &str) -> u64 {
        let (status, started) = self.call("POST", "/traces", Some(body));
        assert_eq!(status, 201, "{started}");
        started["id"].as_u64().expect("an id")
    }

    /// Waits until trace `id`'s state satisfies `done`.
    pub(crate) fn wait(&self, id: u64, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, state) = self.call("GET", &format!("/traces/{id}"), None);
            assert_eq!(status, 200, "{state}");
            if done(&state) {
                return state;
            }
            assert!(
                Instant::now() < deadline,
                "trace {id} never {what}: {state}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn profile(&self, id: u64) -> Value {
        let path = format!("/traces/{id}?format=json");
        let (status, raw) = request(&self.unix(), "GET", &path, None).expect("the agent answers");
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(status, 200, "{text}");
        crate::harness::parse_report(&text)
    }

    /// The agent's tracers running a trace now (not the standby tracer).
    pub(crate) fn tracers(&self) -> Vec<u32> {
        let before = self.standby_pid();
        let children = self.children();
        let after = self.standby_pid();
        children
            .into_iter()
            .filter(|&p| Some(p) != before && Some(p) != after)
            .collect()
    }

    pub(crate) fn standby_pid(&self) -> Option<u32> {
        let (_, list) = self.call("GET", "/traces", None);
        list["standby_pid"].as_u64().map(|p| p as u32)
    }

    /// Waits until the standby tracer has its programs loaded; its pid.
    pub(crate) fn standby_ready(&self) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (_, list) = self.call("GET", "/traces", None);
            if list["standby"] == "ready" {
                return list["standby_pid"].as_u64().expect("its pid") as u32;
            }
            assert!(Instant::now() < deadline, "no standby tracer: {list}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The agent's child processes now.
    pub(crate) fn children(&self) -> Vec<u32> {
        let pid = self.child.id();
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads");
        tasks
            .filter_map(Result::ok)
            .flat_map(|t| {
                std::fs::read_to_string(t.path().join("children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill has no memory effects; the child is not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}
