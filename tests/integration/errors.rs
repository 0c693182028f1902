//! Bad input: one clear sentence on stderr and a non-zero exit status.

use std::process::Command;

use crate::harness::{compile_c, root_or_skip, Target, TRACER};

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
    if !root_or_skip("nonexistent_pid_is_an_error_naming_it") {
        return;
    }
    let pid = unused_pid();
    let (code, err) = run(&["--pid", &pid.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("no process with pid {pid}")), "{err}");
}

#[test]
fn kernel_thread_is_refused() {
    if !root_or_skip("kernel_thread_is_refused") {
        return;
    }
    // pid 2 is kthreadd on Linux.
    let (code, err) = run(&["--pid", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pid 2 is a kernel thread"), "{err}");
}

#[test]
fn a_stripped_static_target_is_refused_with_the_reason() {
    if !root_or_skip("a_stripped_static_target_is_refused_with_the_reason") {
        return;
    }
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
    if !root_or_skip("without_capabilities_it_says_how_to_get_them") {
        return;
    }
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
    if !root_or_skip("an_allocator_the_process_does_not_load_is_refused_with_what_it_loads") {
        return;
    }
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
    if !root_or_skip("a_script_given_to_binary_is_refused_with_what_to_do") {
        return;
    }
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
