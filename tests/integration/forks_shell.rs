//! `--follow-forks` under a shell (`-- bash -c`, `-- sh -c`): the programs
//! its children exec are traced under their own pids and named for what
//! they exec'ed; the flag is refused where it means nothing.

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use crate::{
    forks::{assert_sites_exact_for, only_pid},
    harness::{
        compile_c, pids, read_json, scratch,
        sites::{assert_no_losses, per_calling_site, O2_FLAGS},
        JsonTracer, TRACER,
    },
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A line-by-line reader of a child's pipe, with a timeout.
struct Lines(mpsc::Receiver<String>, Vec<String>);

impl Lines {
    fn new(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines(rx, Vec::new())
    }

    fn wait_for(&mut self, needle: &str) -> String {
        loop {
            match self.0.recv_timeout(TIMEOUT) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.1.push(line),
                Err(_) => panic!("no line with {needle:?}; saw:\n{}", self.1.join("\n")),
            }
        }
    }

    fn rest(&mut self) -> String {
        while let Ok(line) = self.0.recv_timeout(TIMEOUT) {
            self.1.push(line);
        }
        self.1.join("\n")
    }
}

#[test]
fn a_shell_command_with_follow_forks_reports_the_program_it_forks_exactly() {
    let sites = compile_c("sites", "forks-shell", O2_FLAGS);
    let path = scratch("forks-shell.json");
    // `; true` keeps bash from exec'ing the program in its own process: it
    // forks a child that execs it. The command inherits the tracer's stdin
    // and stdout, which sites talks on.
    let script = format!("{}; true", sites.display());
    let mut tracer = Command::new(TRACER)
        .args([
            "--ringbuf-mb",
            "256",
            "--sample-rate",
            "1",
            "--follow-forks",
        ])
        .args(["--format", "json", "-o", path.to_str().expect("utf-8 path")])
        .args(["--", "bash", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start memtrace-bpf");
    let mut stdin = tracer.stdin.take().expect("stdin");
    let mut out = Lines::new(tracer.stdout.take().expect("stdout"));
    let mut err = Lines::new(tracer.stderr.take().expect("stderr"));
    err.wait_for("memtrace-bpf: tracing ");
    out.wait_for("ready");
    stdin.write_all(b"go\n").expect("write go");
    out.wait_for("done");
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) }, 0);
    let status = tracer.wait().expect("wait for tracer");
    // sites exits once its stdin closes, then bash does, and the stderr
    // they inherited from the tracer closes.
    drop(stdin);
    let stderr = err.rest();
    assert!(status.success(), "tracer failed: {stderr}");
    let report = read_json(&path);
    let all = pids(&report);
    assert_eq!(all.len(), 2, "bash and sites: {}", report["processes"]);
    let (bash, program) = (all[0], all[1]);
    assert!(
        report["processes"][1]["command"]
            .as_str()
            .unwrap_or("")
            .ends_with("sites-forks-shell"),
        "{}",
        report["processes"]
    );
    assert_sites_exact_for(&report, program);
    assert!(
        per_calling_site(&only_pid(&report, bash)).is_empty(),
        "bash runs no site"
    );
    assert_no_losses(&report);
}

/// A shell's children that exec a program and exit within a millisecond:
/// with --follow-forks each is listed under the name of what it exec'ed
/// (its command line, or the kernel's name for it once it is gone);
/// without, the note counts them.
#[test]
fn short_lived_children_of_a_shell_are_named_for_what_they_exec_or_counted() {
    // Two external commands (forked) and a builtin (not).
    let script = "/bin/true; /bin/true; true";
    for follow in [true, false] {
        let mut args = Vec::new();
        if follow {
            args.push("--follow-forks");
        }
        args.extend(["--", "sh", "-c", script]);
        let (report, _) = JsonTracer::spawn(&format!("forks-short-{follow}"), &args).finish();
        assert_eq!(report["end_reason"], "target exited");
        let processes = report["processes"].as_array().expect("processes");
        let root = &processes[0];
        assert_eq!(root["command"], format!("sh -c {script}"), "{root}");
        if follow {
            assert_eq!(processes.len(), 3, "{}", report["processes"]);
            for child in &processes[1..] {
                let command = child["command"].as_str().unwrap_or("");
                assert!(
                    command == "/bin/true" || command == "true",
                    "named for its exec: {child}"
                );
            }
        } else {
            assert_eq!(processes.len(), 1, "{}", report["processes"]);
            let note = format!(
                "2 child processes of pid {} were not traced: use --follow-forks",
                root["pid"]
            );
            assert!(
                report["notes"].to_string().contains(&note),
                "{note:?} not in {}",
                report["notes"]
            );
        }
    }
}

/// --follow-forks means nothing under --binary or system-wide: refused
/// with what to do (a bad command line: status 2, no BPF involved).
#[test]
fn follow_forks_without_pid_or_command_is_refused_with_what_to_do() {
    for (args, says) in [
        (
            &["--follow-forks", "--binary", "/bin/true"][..],
            "--binary already traces every process running the program",
        ),
        (
            &["--follow-forks", "-d", "1"][..],
            "system-wide tracing already traces every process",
        ),
    ] {
        let out = Command::new(TRACER).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
