//! `memtrace-bpf -- CMD`: the command is traced from its first instruction.

use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt,
    time::{Duration, Instant},
};

use crate::harness::{
    compile_c,
    process::{proc_state, ready_pid, send, stack_from, state_file, wait_for_line},
    read_json,
    sites::{FP_FLAGS, O2_FLAGS},
    JsonTracer, Tracer,
};

#[test]
fn an_allocation_in_the_first_line_of_main_is_reported_with_the_exit_status() {
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    // It exits as soon as it has allocated, before the tracer's next look
    // at the ring buffer: held at its exit, it is still named, every time.
    for run in 0..3 {
        let tracer = JsonTracer::spawn(
            &format!("first_line-{run}"),
            &["--", bin.to_str().expect("utf-8 path")],
        );
        let (report, _) = tracer.finish();
        assert_eq!(report["end_reason"], "target exited");
        let process = &report["processes"][0];
        assert_eq!(process["exit_status"], "exited with status 3", "{process}");
        assert_eq!(process["exited"], true);
        let in_main = report["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .find(|s| s["frames"][0]["function"] == "main")
            .unwrap_or_else(|| panic!("run {run}: no allocation from main: {}", report["stacks"]));
        assert_eq!(in_main["inuse_bytes"], 12345, "{in_main}");
        assert_eq!(in_main["inuse_objects"], 1, "{in_main}");
    }
}

#[test]
fn a_command_that_cannot_be_found_is_an_error() {
    let out = Tracer::spawn(&["--", "/nonexistent/memtrace-test-cmd"]).finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("command not found"), "{}", out.stderr);
}

#[test]
fn a_stripped_static_command_is_refused_with_the_reason() {
    let bin = compile_c("first_line", "static-stripped", &["-O1", "-static", "-s"]);
    let out = Tracer::spawn(&["--", bin.to_str().expect("utf-8 path")]).finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("is statically linked and stripped"),
        "{}",
        out.stderr
    );
}

/// Waits until process `pid` is in one of `states`.
fn wait_for_state(pid: libc::pid_t, states: &[char], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = proc_state(pid);
        if state.is_some_and(|s| states.contains(&s)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: pid {pid} is in state {state:?}, not {states:?}, after 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Job control works on a traced command: stopped (SIGSTOP, then the
/// terminal's SIGTSTP) and continued, it runs on, ends, and is reported.
#[test]
fn a_command_stopped_and_continued_runs_on_to_its_end() {
    let bin = compile_c("lifecycle", "fp", FP_FLAGS);
    let state = state_file("jobctl");
    let tracer = JsonTracer::spawn(
        "jobctl",
        &[
            "--",
            bin.to_str().expect("utf-8 path"),
            state.to_str().expect("utf-8 path"),
            "jobctl",
        ],
    );
    let pid = ready_pid(&state);
    for (round, sig) in [(1, libc::SIGSTOP), (2, libc::SIGTSTP)] {
        send(pid, sig);
        // T, or t while the tracer holds it (ptrace group stop).
        wait_for_state(pid, &['T', 't'], "stopped");
        send(pid, libc::SIGCONT);
        // The command's SIGCONT handler ran: it was resumed, not left in
        // a tracing stop.
        wait_for_line(&state, &format!("continued {round}"));
    }
    let (report, _) = tracer.finish();
    assert_eq!(report["end_reason"], "target exited");
    let process = &report["processes"][0];
    assert_eq!(process["pid"], pid);
    assert_eq!(process["exit_status"], "exited with status 0", "{process}");
    for (function, bytes) in [("before_stop", 1111), ("after_continue", 2222)] {
        let stack = stack_from(&report, function)
            .unwrap_or_else(|| panic!("no stack from {function}: {}", report["stacks"]));
        assert_eq!(stack["inuse_bytes"], bytes, "{stack}");
    }
}

/// The command's arguments are bytes: one that is not UTF-8 reaches it
/// unchanged, and is shown escaped.
#[test]
fn a_non_utf8_argument_reaches_the_command_unchanged() {
    let bin = compile_c("lifecycle", "fp", FP_FLAGS);
    let state = state_file("argv");
    let odd = OsStr::from_bytes(b"\xff\xfe-not-utf8");
    let tracer = JsonTracer::spawn(
        "argv",
        &[
            OsStr::new("--"),
            bin.as_os_str(),
            state.as_os_str(),
            OsStr::new("argv"),
            odd,
            OsStr::new("plain"),
        ],
    );
    let (report, out) = tracer.finish();
    let written = std::fs::read(&state).expect("the command wrote its arguments");
    assert_eq!(written, b"\xff\xfe-not-utf8\0plain\0", "{:?}", written);
    assert!(
        out.stderr.contains(r"argv \xff\xfe-not-utf8 plain"),
        "the label escapes the bytes: {}",
        out.stderr
    );
    assert_eq!(report["end_reason"], "target exited");
    let stack = stack_from(&report, "with_args")
        .unwrap_or_else(|| panic!("no stack from with_args: {}", report["stacks"]));
    assert_eq!(stack["inuse_bytes"], 4444, "{stack}");
}

/// --exit-status: the tracer exits as the command did, after the report.
#[test]
fn exit_status_makes_the_tracer_exit_with_the_commands_status() {
    let bin = compile_c("first_line", "O2", O2_FLAGS);
    let bin = bin.to_str().expect("utf-8 path");
    let run = |args: &[&str]| JsonTracer::spawn("exit-status", args).finish_unchecked();
    // first_line exits with 3; without the option the tracer exits 0.
    let (out, path) = run(&["--exit-status", "--", bin]);
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    let report = read_json(&path);
    assert_eq!(
        report["processes"][0]["exit_status"],
        "exited with status 3"
    );
    let (out, _) = run(&["--", bin]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    // Killed by a signal: 128 + its number, as a shell reports it.
    let (out, path) = run(&["--exit-status", "--", "/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        out.stderr
    );
    let report = read_json(&path);
    assert_eq!(report["processes"][0]["exit_status"], "killed by signal 15");
}
