//! Watching and signalling a traced process (its state file, its
//! /proc state), running a command with a time limit, and finding one
//! stack in a report.

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::scratch;

/// Waits until the file at `path` has a line containing `needle` (the
/// lifecycle target appends its progress there: its stdout is the
/// tracer's). Returns that line.
pub fn wait_for_line(path: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no line containing {needle:?} in {} within 60 s; it has:\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pid the lifecycle target wrote in its "ready PID" line.
pub fn ready_pid(state: &Path) -> libc::pid_t {
    let line = wait_for_line(state, "ready ");
    line["ready ".len()..]
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// The state letter of /proc/PID/stat (R, S, T, t, Z...), None once gone.
pub fn proc_state(pid: libc::pid_t) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

pub fn send(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid and a signal number.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// A fresh state file for the lifecycle target.
pub fn state_file(tag: &str) -> PathBuf {
    let path = scratch(&format!("{tag}.state"));
    let _ = std::fs::remove_file(&path);
    path
}

/// The report's stack whose innermost frame after `keep` is `function`.
pub fn stack_from<'a>(report: &'a Value, function: &str) -> Option<&'a Value> {
    report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["frames"][1]["function"] == function)
}

/// Runs `cmd` to completion with piped output; panics if it takes longer
/// than `timeout` (after killing it).
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e} (install it: cargo xtask setup)"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}
