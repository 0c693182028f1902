//! Checks made before anything is loaded, each failure with its remedy.

use std::path::Path;

use crate::error::TraceError;

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;

/// Effective capability mask of this process, from /proc/self/status.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_cap_eff(&status)
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1u64 << cap) != 0
}

/// Opening a uprobe needs CAP_SYS_ADMIN: perf_uprobe_event_init checks
/// `capable(CAP_SYS_ADMIN)` since the 2025 fix "perf: Revert to requiring
/// CAP_SYS_ADMIN for uprobes" (also in stable kernels), whatever
/// kernel.perf_event_paranoid says. Measured on 6.18: CAP_BPF + CAP_PERFMON
/// (+ CAP_SYS_PTRACE) fail with EACCES at paranoid 2, 1, 0 and -1;
/// CAP_SYS_ADMIN alone loads, attaches and traces (it implies CAP_BPF and
/// CAP_PERFMON for everything else).
fn missing_caps(caps: u64) -> Option<&'static str> {
    (!has(caps, CAP_SYS_ADMIN)).then_some("CAP_SYS_ADMIN")
}

/// Privileges and kernel support for a trace of `pid` (--pid), of a
/// command the tracer starts (`command`), or else of other processes
/// (--binary, system-wide).
pub fn check(pid: Option<u32>, command: bool) -> Result<(), TraceError> {
    let caps = effective_caps().unwrap_or(0);
    if let Some(missing) = missing_caps(caps) {
        return Err(TraceError::NotPrivileged(missing.to_string()));
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(TraceError::NoUprobes);
    }
    if has(caps, CAP_SYS_PTRACE) {
        return Ok(());
    }
    // Reading another process's maps and files (/proc/PID/maps, root,
    // map_files) is a ptrace access check: its owner, or CAP_SYS_PTRACE.
    // A started command is our own child, made dumpable before it execs.
    if let Some(pid) = pid {
        if owner(pid).is_some_and(|uid| uid != euid()) {
            return Err(TraceError::NeedsSysPtrace(pid));
        }
    } else if !command {
        crate::console::warn(
            "without CAP_SYS_PTRACE, processes of other users cannot be read and are not traced \
             (as root, or add cap_sys_ptrace to the setcap line)",
        );
    }
    Ok(())
}

/// The uid owning /proc/PID: the process's, or root's when it is not
/// dumpable (a setuid program, or one that set PR_SET_DUMPABLE 0), which
/// also takes CAP_SYS_PTRACE to read.
fn owner(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cap_eff() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }

    #[test]
    fn uprobes_need_sys_admin_even_with_bpf_and_perfmon() {
        const CAP_PERFMON: u32 = 38;
        const CAP_BPF: u32 = 39;
        assert_eq!(missing_caps(1 << CAP_SYS_ADMIN), None);
        assert_eq!(
            missing_caps((1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_PTRACE)),
            Some("CAP_SYS_ADMIN")
        );
        assert_eq!(missing_caps(0), Some("CAP_SYS_ADMIN"));
    }
}
