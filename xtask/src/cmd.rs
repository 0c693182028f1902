//! Small helpers for running commands and locating things.

use std::{
    env,
    ffi::OsString,
    fs,
    io::Read,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ lives inside the repository")
        .to_path_buf()
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR` like cargo does.
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => repo_root().join(dir),
        None => repo_root().join("target"),
    }
}

/// The cargo that runs us (`$CARGO`, set by `cargo run`), else the one on PATH.
pub fn cargo() -> Command {
    Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `~/.cargo/bin` (or `$CARGO_HOME/bin`) is where `cargo install` puts
/// bpf-linker; aya-build's nested cargo finds the linker only through PATH.
pub fn cargo_bin_dir() -> Option<PathBuf> {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    Some(home.join("bin"))
}

pub fn put_cargo_bin_on_path() {
    let Some(bin) = cargo_bin_dir() else { return };
    let path = env::var_os("PATH").unwrap_or_default();
    if env::split_paths(&path).any(|p| p == bin) {
        return;
    }
    let mut new = OsString::from(bin);
    if !path.is_empty() {
        new.push(":");
        new.push(path);
    }
    // Single-threaded here: called first thing in main.
    env::set_var("PATH", new);
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A short rendering of a command for messages: program name and arguments.
pub fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(cmd.get_program())
        .to_string_lossy()
        .into_owned();
    cmd.get_args().fold(program, |mut s, a| {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
        s
    })
}

/// Runs a command with inherited stdio; a non-zero exit is an error.
pub fn run(cmd: &mut Command) -> Result<()> {
    let what = describe(cmd);
    eprintln!("> {what}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{what}`"))?;
    if !status.success() {
        bail!("`{what}` failed ({status})");
    }
    Ok(())
}

/// Stdout of a command that ran and succeeded, else None (quietly: used for
/// probing whether something is installed).
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `cmd` with piped output; kills it and fails after `timeout`.
pub fn output_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
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
    let status = match wait_timeout(&mut child, timeout) {
        Ok(status) => status,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.context(what));
        }
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Waits for `child` to exit; fails (leaving it running) after `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            bail!("no exit within {timeout:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a memtrace-bpf other than `ours` is running.
pub fn other_tracer(ours: Option<u32>) -> bool {
    let Ok(dir) = fs::read_dir("/proc") else {
        return false;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| Some(pid) != ours)
        .any(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == "memtrace-bpf")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_timeout_returns_both_pipes_and_fails_on_a_command_that_outlives_it() {
        let out = output_timeout(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(60),
        )
        .expect("sh runs");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        let err = output_timeout(Command::new("sleep").arg("60"), Duration::from_millis(200))
            .expect_err("sleep 60 outlives 200 ms");
        assert!(format!("{err:#}").contains("no exit within"), "{err:#}");
    }

    /// Scratch output of manual runs (stderr captures, saved pages) was
    /// committed at the root once; .gitignore keeps such files out.
    #[test]
    fn the_repository_root_holds_no_scratch_files() {
        let root = repo_root();
        if !root.join(".git").exists() {
            return; // not a checkout (a packaged source tree)
        }
        let out = Command::new("git")
            .current_dir(&root)
            .args(["ls-files", "--cached", "--others", "--exclude-standard"])
            .output()
            .expect("git runs");
        let listed = String::from_utf8_lossy(&out.stdout);
        let scratch: Vec<&str> = listed
            .lines()
            .filter(|f| !f.contains('/'))
            .filter(|f| {
                [".err", ".log", ".folded", ".svg", ".pb.gz"]
                    .iter()
                    .any(|ext| f.ends_with(ext))
                    || *f == "page.html"
            })
            .collect();
        assert!(scratch.is_empty(), "scratch files at the root: {scratch:?}");
    }
}
