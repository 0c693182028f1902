//! Writing a report where a write can block for ever (a FIFO or pipe whose
//! reader stopped reading, a terminal held by Ctrl-S) without leaving the
//! tracer deaf to signals.
//!
//! Once the trace is over the tokio runtime no longer listens, so
//! `abandon_blocked_writes_on_signal` installs plain handlers for SIGINT,
//! SIGTERM and SIGHUP, without SA_RESTART: a write(2) blocked on a pipe
//! returns EINTR, and `Interruptible` then gives up with an error, which
//! sends the report to the fallback file (see `Output::write_with`). Writes to
//! regular files never block for long and are finished. Every such signal
//! is answered on stderr at once.

use std::{
    io::{self, Write},
    os::fd::{AsRawFd, RawFd},
    sync::atomic::{AtomicU32, Ordering},
};

/// SIGINT, SIGTERM and SIGHUP received since the handlers were installed.
static SIGNALS: AtomicU32 = AtomicU32::new(0);

const SAID: &[u8] = b"\nmemtrace-bpf: the trace is over; writing its report (a write that is \
blocked, such as a pipe nobody reads, is abandoned and the report saved to a file instead)\n";

extern "C" fn on_signal(_sig: libc::c_int) {
    SIGNALS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: write(2) is async-signal-safe; the buffer is static.
    unsafe { libc::write(2, SAID.as_ptr().cast(), SAID.len()) };
}

/// From now on SIGINT, SIGTERM and SIGHUP abandon a blocked report write (and are
/// acknowledged on stderr). Call when the trace has ended.
pub fn abandon_blocked_writes_on_signal() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; the handler only touches an
        // atomic and calls write(2). No SA_RESTART: blocked writes return
        // EINTR.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// Whether a signal asked to abandon blocked writes.
pub fn abandoned() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// A writer on a file descriptor that gives up when a signal comes while
/// it waits (blocked, or non-blocking and full). It calls write(2) itself:
/// std's stdout retries EINTR, which would wait for ever.
pub struct Interruptible {
    fd: RawFd,
}

impl Interruptible {
    /// Writes to `fd`, which must stay open while this writer is used.
    pub fn new(fd: &impl AsRawFd) -> Interruptible {
        Interruptible { fd: fd.as_raw_fd() }
    }

    /// Writes to the process's stdout.
    pub fn stdout() -> Interruptible {
        Interruptible { fd: 1 }
    }
}

impl Write for Interruptible {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            // SAFETY: writes from a live buffer to a descriptor the caller
            // keeps open.
            let n = unsafe { libc::write(self.fd, buf.as_ptr().cast(), buf.len()) };
            if let Ok(n) = usize::try_from(n) {
                return Ok(n);
            }
            let err = io::Error::last_os_error();
            if !matches!(
                err.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                return Err(err);
            }
            if abandoned() {
                return Err(io::Error::other(
                    "abandoned on a signal while the write was blocked (nothing was reading)",
                ));
            }
            if err.kind() == io::ErrorKind::WouldBlock {
                let mut pfd = libc::pollfd {
                    fd: self.fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: polls one descriptor described by a local.
                unsafe { libc::poll(&mut pfd, 1, 200) };
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pipe_waits_then_gives_up_once_a_signal_came() {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        let mut w = Interruptible { fd: fds[1] };
        let chunk = vec![0u8; 65536];
        // Fill the pipe (64 KiB by default), then a signal arrives.
        while w.write(&chunk[..4096]).is_ok() {
            let mut pfd = libc::pollfd {
                fd: fds[1],
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: polls one local descriptor without waiting.
            if unsafe { libc::poll(&mut pfd, 1, 0) } == 0 {
                break;
            }
        }
        SIGNALS.fetch_add(1, Ordering::SeqCst);
        let err = w.write_all(&chunk).expect_err("gives up");
        assert!(err.to_string().contains("abandoned"), "{err}");
        SIGNALS.store(0, Ordering::SeqCst);
        // SAFETY: closes the two fds made above.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
