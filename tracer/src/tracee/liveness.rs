//! Whether a process still runs: its pidfd, its /proc state, and its start
//! time, which tells it from a later process that reuses its pid.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::{
    error::TraceError,
    tracee::process::{has_exited, is_zombie, read_stat, stat_field},
};

/// A pidfd: readable once the process has exited.
pub struct PidFd {
    pub fd: OwnedFd,
}

impl PidFd {
    pub fn open(pid: u32) -> Result<PidFd, TraceError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            return Err(TraceError::NoSuchProcess(pid));
        }
        // SAFETY: fd is a fresh descriptor that we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        Ok(PidFd { fd })
    }

    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }
}

/// Whether process `pid` is gone, a zombie, or exiting (its memory
/// released already: its maps read empty).
pub fn process_exited(pid: u32) -> bool {
    has_exited(pid) || std::fs::read(format!("/proc/{pid}/maps")).map_or(true, |m| m.is_empty())
}

/// Gone, a zombie, or its pid now belongs to a process started later.
pub fn has_exited_since(pid: u32, start: Option<u64>) -> bool {
    match read_stat(pid) {
        Some(stat) => is_zombie(&stat) || start.is_some_and(|t| start_of(&stat) != Some(t)),
        None => true,
    }
}

/// The start time (field 22, clock ticks since boot): with the pid, what
/// tells a process from a later one that reuses its pid.
fn start_of(stat: &str) -> Option<u64> {
    stat_field(stat, 22)?.parse().ok()
}

pub fn start_time(pid: u32) -> Option<u64> {
    start_of(&read_stat(pid)?)
}

/// A task's `start_boottime` (ns since boot, as the kernel keeps it) in
/// the clock ticks /proc/PID/stat shows it in (the kernel's
/// nsec_to_clock_t); None for 0 (unknown).
pub fn start_time_of_boot_ns(ns: u64) -> Option<u64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_tick = 1_000_000_000 / u64::try_from(hz).ok().filter(|&h| h > 0)?;
    (ns != 0).then(|| ns / per_tick)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_start_time_is_field_22_even_with_spaces_and_parens_in_the_name() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 1 0 \
                    987654 1000 100";
        assert_eq!(start_of(stat), Some(987_654));
        assert_eq!(stat_field(stat, 3), Some("S"));
        assert_eq!(start_of("1 (x) Z 0"), None);
        assert_eq!(start_time_of_boot_ns(0), None);
        // This process: its stat's start time, from its start_boottime.
        let ours = start_time(std::process::id()).expect("own stat");
        let ns = ours * 10_000_000 + 9_999_999;
        assert_eq!(start_time_of_boot_ns(ns), Some(ours));
    }

    #[test]
    fn this_process_is_running_and_a_changed_start_time_means_exited() {
        let me = std::process::id();
        let start = start_time(me);
        assert!(start.is_some());
        assert!(!has_exited_since(me, start));
        assert!(has_exited_since(me, start.map(|s| s + 1)), "a reused pid");
        assert!(has_exited_since(1 << 23, None), "no such pid");
    }
}
