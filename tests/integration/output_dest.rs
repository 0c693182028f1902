//! `-o` naming something other than a regular file: a FIFO nobody reads is
//! refused at start, and a report write that blocks does not make the
//! tracer deaf to signals.

use std::{
    fs::{File, OpenOptions},
    os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::harness::{read_json, saved_elsewhere, scratch, Tracer};

fn fifo(tag: &str) -> PathBuf {
    let path = scratch(tag);
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    path
}

/// The read end of `path`, opened without waiting for a writer.
fn reader(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .expect("open the FIFO for reading")
}

/// Opening a FIFO for writing waits for a reader: the tracer hung in open,
/// deaf to SIGINT and SIGTERM. It is refused at once instead.
#[test]
fn a_fifo_that_nobody_reads_is_refused_at_start() {
    let path = fifo("no-reader.fifo");
    let out = Tracer::spawn(&["-o", path.to_str().expect("utf-8"), "--", "/bin/true"]).finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("a FIFO (named pipe) that no process is reading"),
        "{}",
        out.stderr
    );
    // Refused before anything was attached (no timing assertion: the
    // harness's own timeout catches a hang).
    assert!(!out.stderr.contains("tracing pid"), "{}", out.stderr);
}

/// A FIFO whose reader holds it open and never reads: the report write
/// blocks. A signal then abandons that write, and the report is saved to a
/// file whose name the error gives, whole.
#[test]
fn a_report_blocked_on_a_fifo_is_saved_elsewhere_on_a_signal() {
    let path = fifo("stalled.fifo");
    let held = reader(&path);
    // The smallest pipe (one page), so that any report fills it.
    // SAFETY: fcntl on an open fd of ours.
    unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    // A command whose report is far larger than the pipe: python's start
    // alone makes thousands of allocations at hundreds of stacks. It says
    // when it has started (a report of a command stopped before it ran
    // could fit in the pipe, and the test would prove nothing).
    let ready = scratch("stalled.ready");
    let _ = std::fs::remove_file(&ready);
    let mut tracer = Tracer::spawn(&[
        "-f",
        "json",
        "-o",
        path.to_str().expect("utf-8"),
        "--",
        "/usr/bin/python3",
        "-c",
        "import pathlib, sys, time; kept = [str(i) for i in range(100000)]; \
         pathlib.Path(sys.argv[1]).write_text('ready'); time.sleep(60)",
        ready.to_str().expect("utf-8"),
    ]);
    tracer
        .stderr
        .wait_for("memtrace-bpf: tracing ", "tracer attach");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        assert!(
            Instant::now() < deadline,
            "python did not start within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    tracer.signal(libc::SIGINT);
    // The report has begun: bytes wait in the pipe, and the rest blocks.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut pfd = libc::pollfd {
            fd: held.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one fd described by a local.
        if unsafe { libc::poll(&mut pfd, 1, 100) } == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "no report began after 60 s");
    }
    std::thread::sleep(Duration::from_millis(300));
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("memtrace-bpf: the trace is over; writing its report"),
        "the signal is answered: {}",
        out.stderr
    );
    let saved = saved_elsewhere(&out.stderr);
    let report = read_json(Path::new(saved));
    assert_eq!(report["end_reason"], "interrupted (SIGINT)", "{report}");
    let _ = std::fs::remove_file(saved);
    drop(held);
}

/// A numbered -o (`{n}`) whose directory vanished during the trace: the
/// final report is not lost but saved in the temporary directory, and the
/// error says where (as for a plain -o). It was refused with "the
/// directory does not exist", and the trace's report was gone.
#[test]
fn a_numbered_report_whose_directory_vanished_is_saved_elsewhere() {
    let dir = scratch("vanished-numbered");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("heap-{n}.json");
    // --interval far beyond the trace: no snapshot before the final one.
    let mut tracer = Tracer::spawn(&[
        "-f",
        "json",
        "--interval",
        "3600",
        "-o",
        path.to_str().expect("utf-8"),
        "--",
        "/bin/sleep",
        "60",
    ]);
    tracer
        .stderr
        .wait_for("memtrace-bpf: tracing ", "tracer attach");
    std::fs::remove_dir_all(&dir).expect("remove the -o directory");
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(out.stderr.contains("heap-1.json"), "{}", out.stderr);
    let saved = saved_elsewhere(&out.stderr);
    let report = read_json(Path::new(saved));
    assert_eq!(report["end_reason"], "interrupted (SIGINT)", "{report}");
    let _ = std::fs::remove_file(saved);
}
