//! Saved profiles that cannot be read, and command lines of `report` and
//! `diff` that make no sense: clear errors, run as `nobody`, never a panic.

use std::{ffi::OsStr, process::Command};

use crate::harness::{
    offline::{as_nobody, ok, open_dir},
    TRACER,
};

/// Runs memtrace-bpf ARGS as nobody and returns stderr, asserting failure.
fn fails(args: &[&OsStr]) -> String {
    let out = as_nobody(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.starts_with("memtrace-bpf: error: ") && !err.contains("panicked"),
        "{err}"
    );
    err
}

#[test]
fn bad_saved_files_give_clear_errors_as_nobody() {
    let dir = open_dir("offline-bad");
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    // A valid profile whose function name holds a terminal escape.
    let good = write(
        "good.json",
        br#"{"format":"memtrace-bpf/2","target":"t","totals":{"inuse_bytes":5},
            "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
            "frames":[{"function":"evil\u001b[2J","module":"/bin/x"}]}"#,
    );
    let text = ok(&as_nobody(&[OsStr::new("report"), good.as_os_str()]));
    assert!(
        text.contains("evil\\x1b[2J") && !text.contains('\u{1b}'),
        "{text}"
    );
    let pb = dir.join("good.pb.gz");
    ok(&as_nobody(&[
        OsStr::new("report"),
        good.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    let gz = std::fs::read(&pb).expect("pprof");
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "malformed.json",
            b"{\"format\": \"memtrace-bpf/2\", \"stacks\": [".to_vec(),
            "malformed",
        ),
        (
            "future.json",
            br#"{"format":"memtrace-bpf/3","stacks":[]}"#.to_vec(),
            "memtrace-bpf/3",
        ),
        (
            "range.json",
            br#"{"format":"memtrace-bpf/2","stacks":[{"frames":[7]}],"frames":[]}"#.to_vec(),
            "frame index 7 is out of range",
        ),
        ("cut.pb.gz", gz[..gz.len() / 2].to_vec(), "gzip"),
        ("noise.bin", vec![0xff; 64], "malformed"),
        ("empty.json", Vec::new(), "it is empty (0 bytes)"),
    ];
    for (name, bytes, says) in cases {
        let path = write(name, &bytes);
        let err = fails(&[OsStr::new("report"), path.as_os_str()]);
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
        let err = fails(&[OsStr::new("diff"), good.as_os_str(), path.as_os_str()]);
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
    }
    let err = fails(&[OsStr::new("report"), dir.join("missing.json").as_os_str()]);
    assert!(
        err.contains("missing.json") && err.contains("cannot open"),
        "{err}"
    );
    let err = fails(&[
        OsStr::new("report"),
        good.as_os_str(),
        OsStr::new("--sort"),
        OsStr::new("growth"),
    ]);
    assert!(
        err.contains("no history") && err.contains("--interval"),
        "{err}"
    );
}

#[test]
fn bad_command_lines_of_report_and_diff_exit_with_status_2() {
    for args in [
        &["diff", "only-one.json"][..],
        &["report", "x.json", "--top", "0"],
        &["report", "x.json", "--format", "nonsense"],
    ] {
        let out = Command::new(TRACER).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

/// A saved file's hostile name is escaped once on stderr and in the text
/// report (`h\x1bx`, not `h\\x1bx`), and kept exact in JSON's target.
#[test]
fn a_hostile_file_name_is_escaped_once() {
    let dir = open_dir("offline-name");
    let json = dir.join("good.json");
    std::fs::write(
        &json,
        br#"{"format":"memtrace-bpf/2","target":"t","totals":{"inuse_bytes":5},
            "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
            "frames":[{"function":"f","module":"/bin/x"}]}"#,
    )
    .expect("write");
    let pb = dir.join("h\x1bx.pb.gz");
    let args = |extra: &[&'static str]| {
        let mut a: Vec<std::ffi::OsString> = vec!["report".into(), pb.clone().into()];
        a.extend(extra.iter().map(std::ffi::OsString::from));
        a
    };
    ok(&as_nobody(&[
        OsStr::new("report"),
        json.as_os_str(),
        OsStr::new("-f"),
        OsStr::new("pprof"),
        OsStr::new("-o"),
        pb.as_os_str(),
    ]));
    let text = ok(&as_nobody(&args(&[])));
    let first = text.lines().next().unwrap_or_default();
    assert!(first.ends_with("h\\x1bx.pb.gz"), "{text}");
    assert!(!first.contains("\\\\"), "escaped twice: {first}");
    let out = ok(&as_nobody(&args(&["-f", "json"])));
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let target = v["target"].as_str().expect("target");
    assert!(
        target.ends_with("h\x1bx.pb.gz"),
        "JSON keeps it exact: {target:?}"
    );
    let sort = args(&["--sort", "growth"]);
    let err = fails(
        &sort
            .iter()
            .map(std::ffi::OsString::as_os_str)
            .collect::<Vec<_>>(),
    );
    assert!(
        err.contains("h\\x1bx.pb.gz") && !err.contains("\\\\"),
        "{err}"
    );
    // diff: its text names the file escaped once, its JSON exactly.
    let diff = |format: &str| {
        ok(&as_nobody(&[
            OsStr::new("diff"),
            pb.as_os_str(),
            json.as_os_str(),
            OsStr::new("-f"),
            OsStr::new(format),
        ]))
    };
    let text = diff("text");
    assert!(
        text.contains("h\\x1bx.pb.gz (file /") && !text.contains("\\\\"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&diff("json")).expect("JSON");
    let file = v["old"]["file"].as_str().expect("old.file");
    assert!(
        file.ends_with("h\x1bx.pb.gz"),
        "JSON keeps it exact: {file:?}"
    );
    let err = fails(&[
        OsStr::new("report"),
        dir.join("m\x1bissing.json").as_os_str(),
    ]);
    assert!(
        err.contains("m\\x1bissing") && !err.contains("\\\\"),
        "{err}"
    );
}

#[test]
fn report_into_a_pipe_whose_reader_is_gone_exits_quietly() {
    // `memtrace-bpf report FILE | head`: head exits, and the saved file is
    // still there, so there is nothing to say.
    let dir = open_dir("offline-pipe");
    let path = dir.join("p.json");
    std::fs::write(
        &path,
        br#"{"format":"memtrace-bpf/2","target":"t","totals":{"inuse_bytes":5},
            "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
            "frames":[{"function":"f","module":"/bin/x"}]}"#,
    )
    .expect("write");
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-int array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: two fresh fds that nothing else owns.
    let (reader, writer) = unsafe {
        use std::os::fd::FromRawFd as _;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    // The reader is gone before anything is written: every write fails.
    drop(reader);
    let out = Command::new(TRACER)
        .arg("report")
        .arg(&path)
        .stdout(std::process::Stdio::from(writer))
        .output()
        .expect("run the tracer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(err.is_empty(), "{err}");
}
