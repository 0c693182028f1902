//! Checks made before anything is loaded, each failure with its remedy.

use std::path::Path;

use crate::error::TraceError;

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

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

/// Names of the capabilities loading and attaching uprobes needs but this
/// process lacks. CAP_SYS_ADMIN covers both (kernels before 5.8 need it).
fn missing_caps(caps: u64) -> Vec<&'static str> {
    if has(caps, CAP_SYS_ADMIN) {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if !has(caps, CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(caps, CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    missing
}

pub fn check() -> Result<(), TraceError> {
    let caps = effective_caps().unwrap_or(0);
    let missing = missing_caps(caps);
    if !missing.is_empty() {
        return Err(TraceError::NotPrivileged(missing.join(" and ")));
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe/type").exists() {
        return Err(TraceError::NoUprobes);
    }
    Ok(())
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
    fn sys_admin_or_bpf_plus_perfmon() {
        assert!(missing_caps(1 << CAP_SYS_ADMIN).is_empty());
        assert!(missing_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_empty());
        assert_eq!(missing_caps(1 << CAP_BPF), vec!["CAP_PERFMON"]);
        assert_eq!(missing_caps(0), vec!["CAP_BPF", "CAP_PERFMON"]);
    }
}
