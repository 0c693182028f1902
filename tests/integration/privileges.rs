//! Running without root: a copy of the tracer with file capabilities, run
//! as `nobody` with setpriv. On this kernel opening a uprobe takes
//! CAP_SYS_ADMIN (CAP_BPF + CAP_PERFMON are refused with EACCES), and
//! reading another user's process takes CAP_SYS_PTRACE: the preflight must
//! say which is missing and how to grant it, and the working set must trace.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use crate::harness::{
    compile_c,
    process::{send, wait_for_line},
    read_json, scratch,
    sites::{assert_sites_exact, O2_FLAGS},
    Target, TRACER,
};

/// A scratch directory removed on drop: a copy of the tracer with
/// capabilities that anyone may run must not outlive the test.
struct CapDir(PathBuf);

impl Drop for CapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory `nobody` may write, holding a copy of the tracer with file
/// capabilities `caps` (setcap syntax) and a copy of `program`.
fn capable_copy(tag: &str, caps: &str, program: &Path) -> (CapDir, PathBuf, PathBuf) {
    let dir = scratch(&format!("caps-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod dir");
    let tracer = dir.join("memtrace-bpf");
    std::fs::copy(TRACER, &tracer).expect("copy the tracer");
    let status = Command::new("setcap")
        .arg(caps)
        .arg(&tracer)
        .status()
        .expect("run setcap (libcap2-bin)");
    assert!(status.success(), "setcap {caps} failed");
    let target = dir.join(program.file_name().expect("program name"));
    std::fs::copy(program, &target).expect("copy the program");
    (CapDir(dir), tracer, target)
}

/// Runs `tracer args` as nobody, with no inheritable capabilities: only
/// the file's.
fn run_as_nobody(tracer: &Path, args: &[&str]) -> Output {
    let out = Command::new("timeout")
        .args(["60", "setpriv", "--reuid=nobody", "--regid=nogroup"])
        .args(["--clear-groups", "--inh-caps=-all"])
        .arg(tracer)
        .args(args)
        .output()
        .expect("run setpriv");
    assert_ne!(out.status.code(), Some(124), "timed out");
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn cap_bpf_and_cap_perfmon_are_refused_with_the_setcap_line_that_works() {
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    let (_dir, tracer, target) = capable_copy("bpf-perfmon", "cap_bpf,cap_perfmon+ep", &bin);
    let out = run_as_nobody(&tracer, &["--", target.to_str().expect("utf-8 path")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lacks CAP_SYS_ADMIN"), "{err}");
    assert!(err.contains("setcap cap_sys_admin+ep"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn another_users_process_needs_cap_sys_ptrace_and_the_message_says_so() {
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    let (_dir, tracer, _) = capable_copy("no-ptrace", "cap_sys_admin+ep", &bin);
    // Root's process, not nobody's.
    let sites = compile_c("sites", "fp-caps", crate::harness::sites::FP_FLAGS);
    let target = Target::start(&sites, &[]);
    let pid = target.pid().to_string();
    let out = run_as_nobody(&tracer, &["--pid", &pid, "--duration", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("process {pid} belongs to another user")),
        "{err}"
    );
    assert!(
        err.contains("setcap cap_sys_admin,cap_sys_ptrace+ep"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// With cap_sys_admin alone, nobody traces its own command from its first
/// line, names its frames (it is held at its exit: ptrace works), and gets
/// its exit status.
#[test]
fn cap_sys_admin_alone_traces_a_command_as_an_unprivileged_user() {
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    let (dir, tracer, target) = capable_copy("sys-admin", "cap_sys_admin+ep", &bin);
    let path = dir.0.join("report.json");
    let out = run_as_nobody(
        &tracer,
        &[
            "--sample-rate",
            "1",
            "--format",
            "json",
            "-o",
            path.to_str().expect("utf-8 path"),
            "--",
            target.to_str().expect("utf-8 path"),
        ],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "target exited");
    assert_eq!(
        report["processes"][0]["exit_status"],
        "exited with status 3"
    );
    let in_main = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["frames"][0]["function"] == "main")
        .unwrap_or_else(|| panic!("no allocation from main: {}", report["stacks"]));
    assert_eq!(in_main["inuse_bytes"], 12345, "{in_main}");
}

/// With cap_sys_admin and cap_sys_ptrace, nobody traces root's process by
/// pid and gets the exact report root gets.
#[test]
fn cap_sys_admin_and_cap_sys_ptrace_trace_another_users_process() {
    let bin = compile_c("sites", "fp-caps-ptrace", crate::harness::sites::FP_FLAGS);
    let (dir, tracer, _) = capable_copy("sys-ptrace", "cap_sys_admin,cap_sys_ptrace+ep", &bin);
    let mut target = Target::start(&bin, &[]);
    let path = dir.0.join("report.json");
    let log = dir.0.join("stderr");
    let mut child = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup"])
        .args(["--clear-groups", "--inh-caps=-all"])
        .arg(&tracer)
        // As the harness does for every exact trace: a ring buffer that
        // holds the sites' bursts on a busy machine.
        .args(["--ringbuf-mb", "256", "--sample-rate", "1"])
        .args(["--format", "json", "-o"])
        .arg(&path)
        .args(["--pid", &target.pid().to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("create log"))
        .spawn()
        .expect("run setpriv");
    // setpriv execs the tracer: this pid is the tracer's.
    let tracer_pid = child.id() as libc::pid_t;
    wait_for_line(&log, "memtrace-bpf: tracing ");
    target.run_sites();
    send(tracer_pid, libc::SIGTERM);
    let status = child.wait().expect("wait for the tracer");
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status:?}: {err}");
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    assert_sites_exact(&report);
}
