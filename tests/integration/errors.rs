//! Bad input: one clear sentence on stderr and a non-zero exit status.

use std::process::Command;

use crate::harness::{compile_c, Target, TRACER};

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(TRACER)
        .args(args)
        .output()
        .expect("run memtrace-bpf");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn unused_pid() -> u32 {
    (4_000_000..4_194_304)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .expect("a free pid")
}

#[test]
fn nonexistent_pid_is_an_error_naming_it() {
    let pid = unused_pid();
    let (code, err) = run(&["--pid", &pid.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("no process with pid {pid}")), "{err}");
}

#[test]
fn kernel_thread_is_refused() {
    // pid 2 is kthreadd on Linux.
    let (code, err) = run(&["--pid", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pid 2 is a kernel thread"), "{err}");
}

#[test]
fn a_stripped_static_target_is_refused_with_the_reason() {
    let bin = compile_c("sites", "static-stripped", &["-O1", "-static", "-s"]);
    let target = Target::start(&bin, &[]);
    let (code, err) = run(&["--pid", &target.pid().to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no object it loads defines malloc and free")
            && err.contains("statically linked and stripped"),
        "{err}"
    );
}

#[test]
fn without_capabilities_it_says_how_to_get_them() {
    let out = Command::new("setpriv")
        .args([
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            TRACER,
            "--pid",
            "1",
        ])
        .output()
        .expect("run setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Uprobes need CAP_SYS_ADMIN on current kernels (see privileges.rs).
    assert!(err.contains("lacks CAP_SYS_ADMIN"), "{err}");
    assert!(err.contains("run it as root"), "{err}");
    assert!(err.contains("setcap cap_sys_admin+ep"), "{err}");
}

#[test]
fn bad_command_lines_exit_with_status_2() {
    // No BPF involved: runs without root too. (No arguments at all is
    // valid: system-wide tracing.)
    let (code, err) = run(&["--pid"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--pid"), "{err}");
    let (code, err) = run(&["--pid", "1", "--binary", "/bin/true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, err) = run(&["--pid", "1", "--comm", "x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("system-wide"), "{err}");
    let (code, err) = run(&["--pid", "1", "--ringbuf-mb", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("power of two"), "{err}");
}

#[test]
fn an_allocator_the_process_does_not_load_is_refused_with_what_it_loads() {
    let bin = compile_c("sites", "allocator-missing", &["-O1"]);
    let target = Target::start(&bin, &[]);
    let (code, err) = run(&[
        "--pid",
        &target.pid().to_string(),
        "--allocator",
        "mimalloc",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("--allocator mimalloc:") && err.contains("libc.so.6 (glibc)"),
        "{err}"
    );
}

#[test]
fn a_script_given_to_binary_is_refused_with_what_to_do() {
    let script = crate::harness::scratch("binary-script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write script");
    let path = script.to_str().expect("utf-8 path");
    let (code, err) = run(&["--binary", path, "--duration", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("not an ELF executable") && err.contains(&format!("-- {path}")),
        "{err}"
    );
}

/// A process the tracer may not inspect (another user's, without
/// CAP_SYS_PTRACE) is named as unreadable, with what to do, not as missing.
#[test]
fn a_pid_that_cannot_be_read_is_explained() {
    let target = Target::start(
        std::path::Path::new("/usr/bin/setpriv"),
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/bin/sh",
            "-c",
            "echo ready; exec sleep 60",
        ],
    );
    let pid = target.pid().to_string();
    // Root with only the capability uprobes need here: no CAP_SYS_PTRACE.
    let out = Command::new("setpriv")
        .args([
            "--bounding-set=-all,+sys_admin",
            "--",
            TRACER,
            "--pid",
            &pid,
        ])
        .output()
        .expect("run setpriv (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // Found by the preflight, before anything is loaded.
    assert!(
        err.contains(&format!("process {pid} belongs to another user"))
            && err.contains("needs CAP_SYS_PTRACE"),
        "{err}"
    );
    assert!(!err.contains("no process with pid"), "{err}");
}

/// A zombie (exited, not reaped) has no memory left: said so.
#[test]
fn a_zombie_pid_is_explained() {
    // The shell's child waits for a line on stdin; the shell becomes
    // `sleep`, which never reaps it; then the line lets the child exit.
    let mut parent = Target::start(
        std::path::Path::new("/bin/sh"),
        &[
            "-c",
            "exec 3<&0; (read x <&3) & echo ready; echo child $!; exec sleep 60 3<&-",
        ],
    );
    let line = parent.wait_for("child");
    let zombie: u32 = line
        .trim_start_matches("child ")
        .trim()
        .parse()
        .expect("child pid");
    let comm = format!("/proc/{}/comm", parent.pid());
    // No time limits of our own: each state comes, or `sleep 60` ends and
    // the reads below fail.
    while std::fs::read_to_string(&comm).expect("parent comm").trim() != "sleep" {
        std::thread::yield_now();
    }
    parent.send("exit");
    while !std::fs::read_to_string(format!("/proc/{zombie}/stat"))
        .expect("the zombie stays until its parent dies")
        .contains(") Z ")
    {
        std::thread::yield_now();
    }
    let (code, err) = run(&["--pid", &zombie.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("pid {zombie} has exited (a zombie")),
        "{err}"
    );
}

/// tests/targets/no_malloc.c: static, no C library, no malloc.
fn no_malloc(tag: &str, extra: &[&str]) -> std::path::PathBuf {
    let mut flags = vec!["-O1", "-static", "-nostdlib", "-fno-stack-protector"];
    flags.extend_from_slice(extra);
    compile_c("no_malloc", tag, &flags)
}

/// `--pid`, `--pid --allocator` and `--binary` on `bin` all fail saying
/// `why`, and never blame stripping.
fn assert_refused_with(bin: &std::path::Path, why: &str) {
    let target = Target::start(bin, &[]);
    let pid = target.pid().to_string();
    let path = bin.to_str().expect("utf-8 path");
    for args in [
        vec!["--pid", &pid],
        vec!["--pid", &pid, "--allocator", "jemalloc"],
        vec!["--pid", &pid, "--allocator", "glibc"],
        vec!["--binary", path, "--duration", "1"],
    ] {
        let (code, err) = run(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("stripped"), "{args:?}: {err}");
    }
}

/// A static program with its own allocator (as a Go program is) defines
/// no malloc: it is not "stripped", and --allocator has nothing to list.
#[test]
fn a_program_with_its_own_allocator_is_explained() {
    let bin = no_malloc("own", &[]);
    assert_refused_with(&bin, "is statically linked and defines no malloc or free");
}

#[test]
fn a_32_bit_program_is_explained() {
    let bin = no_malloc("m32", &["-m32", "-fno-pie", "-no-pie"]);
    assert_refused_with(&bin, "is a 32-bit I386 program: memtrace-bpf traces 64-bit");
}

/// `--binary` with something that is not a program file: what it is, and
/// what to pass instead.
#[test]
fn binary_paths_that_are_not_programs_are_explained() {
    let dir = crate::harness::scratch("binary-not-a-program");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let data = dir.join("data.bin");
    std::fs::copy(compile_c("sites", "binary-noexec", &["-O1"]), &data).expect("copy");
    let mut perms = std::fs::metadata(&data).expect("stat").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o644);
    std::fs::set_permissions(&data, perms).expect("chmod");
    let missing = dir.join("missing");
    let cases = [
        (
            dir.as_path(),
            "is a directory: pass the path of the program file",
        ),
        (missing.as_path(), "no such file"),
        (data.as_path(), "is not executable (mode 644)"),
        (
            std::path::Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
            "is a shared library, not a program",
        ),
    ];
    for (path, why) in cases {
        let path = path.to_str().expect("utf-8 path");
        let (code, err) = run(&["--binary", path, "--duration", "1"]);
        assert_eq!(code, 1, "{path}: {err}");
        assert!(err.contains(why), "{path}: {err}");
        assert!(!err.contains("start the script with"), "{path}: {err}");
    }
}

#[test]
fn pid_zero_and_the_tracers_own_pid_are_refused() {
    let (code, err) = run(&["--pid", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pid 0 is not a process"), "{err}");
    // The shell's pid is the tracer's once it execs it.
    let out = Command::new("/bin/sh")
        .args(["-c", &format!("exec {TRACER} --pid $$ --duration 1")])
        .output()
        .expect("run sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is memtrace-bpf itself"), "{err}");
}

/// Whether `pid` holds a pidfd: the tracer opens one for `--pid` once it
/// has inspected the process, before it loads and attaches its programs.
fn holds_pidfd(pid: u32) -> Option<bool> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(
        fds.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .any(|l| l.to_string_lossy().contains("[pidfd]")),
    )
}

/// The target is killed once the tracer has inspected it and before its
/// probes are attached (loading the BPF programs comes between): whether
/// the attach then fails (perf_event_open: No such process, or /proc/PID
/// gone) or the check after it sees the exit, the tracer says the process
/// exited before the probes were attached.
#[test]
fn a_pid_that_exits_during_attach_is_reported_as_such() {
    let mut target = Target::start(
        std::path::Path::new("/bin/sh"),
        &["-c", "echo ready; exec sleep 60"],
    );
    let pid = target.pid();
    let tracer = Command::new(TRACER)
        .args(["--pid", &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start memtrace-bpf");
    // No time limit of our own: the tracer opens the pidfd or exits.
    while holds_pidfd(tracer.id()) == Some(false) {
        std::thread::yield_now();
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    let out = tracer.wait_with_output().expect("wait for memtrace-bpf");
    let _ = target.wait_exit();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "process {pid} exited before the probes were attached"
        )),
        "{err}"
    );
    assert!(!err.contains("perf_event_open"), "{err}");
}

/// A quoted value is escaped once, where the error is printed: `a\x1bb`,
/// not `a\\x1bb` (escaped where the message was made, then again) nor
/// `a\\\\\\\\x1bb` (and once more through `{:?}`).
#[test]
fn errors_quote_hostile_values_escaped_once() {
    let env_run = |var: &str, val: &str| {
        let out = Command::new(TRACER)
            .env(var, val)
            .args(["--otlp", "http://127.0.0.1:9", "-d", "1", "--", "/bin/true"])
            .output()
            .expect("run memtrace-bpf");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Each with what it must quote: a header is named, never its value.
    let cases = [
        ("nu-\\x1bb", run(&["--cgroup", "nu-\x1bb", "-d", "1"]).1),
        (
            "\"http://a\\x1bb\"",
            run(&["--otlp", "http://a\x1bb", "-d", "1", "--", "/bin/true"]).1,
        ),
        ("\"a…\"", env_run("OTEL_EXPORTER_OTLP_HEADERS", "a\x1bb=1")),
        (
            "\"a\\x1bb\"",
            env_run("OTEL_RESOURCE_ATTRIBUTES", "a\x1bb=1"),
        ),
    ];
    for (quoted, err) in cases {
        assert!(err.starts_with("memtrace-bpf: error: "), "{err}");
        assert!(err.contains(quoted), "{quoted}: {err}");
        assert!(!err.contains("\\\\"), "escaped twice: {err}");
        assert!(!err.contains('\x1b'), "raw: {err}");
    }
}

/// stdout and stderr both closed (`memtrace-bpf ... 2>&1 | head -0`): the
/// report cannot be written and neither can the error saying so; the
/// status says it (1), without a panic (101).
#[test]
fn closed_stdout_and_stderr_give_status_1_not_a_panic() {
    for args in [
        &["--keep-running", "--pid", "1"][..],
        &["-d", "1", "--", "/bin/true"],
    ] {
        let mut child = Command::new(TRACER)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run memtrace-bpf");
        // Closes the read ends: every write gets EPIPE.
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().expect("wait");
        let want = if args[0] == "--keep-running" { 2 } else { 1 };
        assert_eq!(status.code(), Some(want), "{args:?}: {status:?}");
    }
}
