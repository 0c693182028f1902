//! Output safety: names a traced program controls (its path, argv, symbol
//! names) are escaped in text and collapsed output and on stderr, exact in
//! JSON; `-o` is checked before anything is attached and written
//! atomically; the tracer never lists itself.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::harness::{
    compile_c,
    hostile::{assert_no_raw_controls, hostile_program, hostile_symbol},
    parse_report, read_json, saved_elsewhere, scratch, Target, Tracer, TRACER,
};

/// How text output shows it.
fn hostile_symbol_text() -> String {
    let pad = hostile_symbol().len() - "evil\x1b[2J\x1b]0;pwned\x07\nforged;x 99".len();
    format!(
        "evil\\x1b[2J\\x1b]0;pwned\\x07\\nforged;x{} 99",
        "_".repeat(pad)
    )
}
const HOSTILE_FILE_SHOWN: &str = "ho\\x1b[31mstile\\tprog";
const HOSTILE_ARGS: [&str; 2] = ["\x1b]0;pwned\x07", "arg\nforged"];

/// Traces PROGRAM ARGS wait (`--pid`, so that its command line is read
/// while it runs) with `format`; returns (stdout, stderr).
fn trace_hostile(program: &Path, format: &str) -> (String, String) {
    let mut target_args = HOSTILE_ARGS.to_vec();
    target_args.push("wait");
    let mut target = Target::start(program, &target_args);
    let pid = target.pid().to_string();
    let tracer = Tracer::start(&["--format", format, "--pid", &pid]);
    target.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    (out.stdout, out.stderr)
}

#[test]
fn hostile_names_are_escaped_in_text_and_collapsed_and_exact_in_json() {
    let program = hostile_program("escape");
    let dir = program.parent().expect("a directory").display();
    let shown_path = format!("{dir}/{HOSTILE_FILE_SHOWN}");

    let (text, stderr) = trace_hostile(&program, "text");
    assert_no_raw_controls("text report", &text);
    assert_no_raw_controls("stderr", &stderr);
    assert!(
        text.contains(&hostile_symbol_text()),
        "symbol escaped:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "{shown_path} \\x1b]0;pwned\\x07 arg\\nforged wait"
        )),
        "command line escaped:\n{text}"
    );
    assert!(
        stderr.contains(&shown_path),
        "path escaped on stderr:\n{stderr}"
    );

    let (folded, stderr) = trace_hostile(&program, "collapsed");
    assert_no_raw_controls("collapsed", &folded);
    assert_no_raw_controls("stderr", &stderr);
    let leaf = "evil\\x1b[2J\\x1b]0:pwned\\x07\\nforged:x";
    let line = folded
        .lines()
        .find(|l| l.contains(leaf))
        .unwrap_or_else(|| panic!("no stack through the hostile function:\n{folded}"));
    assert!(
        line.ends_with("\\x2099 4096"),
        "the name's trailing number is not a count: {line}"
    );

    let (json, _) = trace_hostile(&program, "json");
    assert_no_raw_controls("JSON", &json);
    let report: Value = parse_report(&json);
    let process = &report["processes"][0];
    let mut command = vec![program.to_str().expect("UTF-8 path")];
    command.extend(HOSTILE_ARGS);
    command.push("wait");
    assert_eq!(process["command"], command.join(" "), "exact command line");
    assert_eq!(process["program"], command[0], "exact program path");
    let symbol = hostile_symbol();
    let named = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s["frames"].as_array().cloned().unwrap_or_default())
        .any(|f| f["function"] == symbol.as_str());
    assert!(named, "exact symbol name in JSON:\n{json}");
}

#[test]
fn a_program_path_with_spaces_names_the_process_root_frame() {
    let program = hostile_program("root-frame");
    let mut first = Target::start(&program, &["wait"]);
    let mut second = Target::start(&program, &["wait"]);
    let tracer = Tracer::start(&[
        "--binary",
        program.to_str().expect("UTF-8 path"),
        "--format",
        "collapsed",
    ]);
    first.run_sites();
    second.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    assert_no_raw_controls("collapsed", &out.stdout);
    for target in [&first, &second] {
        let root = format!("{HOSTILE_FILE_SHOWN} (pid {});", target.pid());
        assert!(
            out.stdout.lines().any(|l| l.starts_with(&root)),
            "a stack rooted at {root:?} (the file name, not the first word of the command line):\n{}",
            out.stdout
        );
    }
}

/// `memtrace-bpf ARGS -- sh -c 'touch MARKER'`: (status, stderr, whether
/// the command ran).
fn run_with_marker(tag: &str, args: &[&str]) -> (i32, String, bool) {
    let marker = scratch(&format!("{tag}.ran"));
    let _ = std::fs::remove_file(&marker);
    let touch = format!("touch '{}'", marker.display());
    let out = Command::new(TRACER)
        .args(args)
        .args(["--", "/bin/sh", "-c", &touch])
        .output()
        .expect("run memtrace-bpf");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        marker.exists(),
    )
}

#[test]
fn an_unwritable_output_fails_before_anything_is_attached() {
    let dir = std::env::temp_dir();
    let dir = dir.to_str().expect("UTF-8 temp dir");
    for (path, remedy) in [
        ("/nonexistent/dir/r.txt", "mkdir -p /nonexistent/dir"),
        (dir, "name a file in it"),
        ("/proc/version", "choose a path in a writable directory"),
    ] {
        let (code, err, ran) = run_with_marker("unwritable-output", &["-o", path]);
        assert_eq!(code, 1, "-o {path}: {err}");
        assert!(
            err.contains(&format!("-o {path}")) && err.contains(remedy),
            "{err}"
        );
        assert!(!err.contains("memtrace-bpf: tracing"), "-o {path}: {err}");
        assert!(!ran, "-o {path}: the command must not start: {err}");
    }
}

#[test]
fn a_normal_output_leaves_exactly_the_report() {
    let dir = scratch("output-one-file");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let report = dir.join("r.txt");
    let (code, err, ran) =
        run_with_marker("output-one-file", &["-o", report.to_str().expect("UTF-8")]);
    assert_eq!(code, 0, "{err}");
    assert!(ran, "the command ran: {err}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["r.txt"], "only the report, no temporary file");
    let text = std::fs::read_to_string(&report).expect("read report");
    assert!(
        text.starts_with("memtrace-bpf report: command /bin/sh"),
        "{text}"
    );
    assert!(text.contains("\nLosses:\n"), "a complete report: {text}");
}

#[test]
fn a_report_whose_directory_vanished_is_saved_elsewhere_and_said_so() {
    let bin = compile_c("steady", "vanished-output", &["-O1"]);
    let target = Target::start(&bin, &[]);
    let dir = scratch("output-vanishes");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let report = dir.join("r.json");
    let tracer = Tracer::start(&[
        "--pid",
        &target.pid().to_string(),
        "--format",
        "json",
        "-o",
        report.to_str().expect("UTF-8"),
    ]);
    std::fs::remove_dir_all(&dir).expect("remove the output directory");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    let wanted = format!("could not be written to {}", report.display());
    assert!(out.stderr.contains(&wanted), "{}", out.stderr);
    let saved = saved_elsewhere(&out.stderr);
    let json = read_json(&PathBuf::from(saved));
    assert_eq!(json["processes"][0]["pid"], target.pid());
    let _ = std::fs::remove_file(saved);
}

#[test]
fn out_of_range_numbers_are_usage_errors_not_panics() {
    // No BPF involved: runs without root too.
    for args in [
        ["--duration", "1e20"],
        ["--sample-rate", "18446744073709551615"],
        ["--max-live", "4294967295"],
        ["--top", "0"],
    ] {
        let (code, err, ran) = run_with_marker("numbers", &args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("memtrace-bpf: error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!ran, "{args:?}: the command must not start");
    }
}

#[test]
fn system_wide_tracing_does_not_list_the_tracer() {
    let _one_at_a_time = crate::harness::system_wide_lock();
    let path = scratch("system-wide-self.json");
    let _ = std::fs::remove_file(&path);
    // Only threads named like the tracer: it is the one process that could
    // match, and the rest of the machine does not pay for this test.
    let tracer = Tracer::start(&[
        "--comm",
        "memtrace-bpf",
        "--format",
        "json",
        "-o",
        path.to_str().expect("UTF-8"),
        "--duration",
        "1",
    ]);
    let me = tracer.pid();
    // The report is renamed into place, complete, before the probes are
    // detached; detaching every object of a busy machine can take a
    // minute, which this test need not wait for (the tracer is killed
    // on drop).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !path.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no report at {} within 300 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let report = read_json(&path);
    let listed: Vec<&Value> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"] == me)
        .collect();
    assert!(listed.is_empty(), "the tracer lists itself: {listed:?}");
    let own_stacks = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["pid"] == me)
        .count();
    assert_eq!(own_stacks, 0, "the tracer's own allocations were recorded");
}

#[test]
fn error_messages_escape_what_they_quote() {
    // The error names the allocator asked for and the program's path.
    let program = hostile_program("error");
    let (code, err, _) =
        run_with_marker("error-escape", &["--allocator", "x\x1b[2J\ny", "-d", "1"]);
    assert_eq!(code, 1, "{err}");
    assert_no_raw_controls("stderr", &err);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("--allocator x\\x1b[2J\\ny:"), "{err}");
    let out = Command::new(TRACER)
        .args([
            "--binary",
            program.to_str().expect("UTF-8"),
            "--allocator",
            "mimalloc",
        ])
        .args(["-d", "1"])
        .output()
        .expect("run memtrace-bpf");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_no_raw_controls("stderr", &err);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(HOSTILE_FILE_SHOWN), "{err}");
}
