//! The tracer's own CPU time and memory, for --verbose lines and /metrics.

/// What this process has used so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub user_secs: f64,
    pub system_secs: f64,
    /// Resident now (VmRSS), KiB; 0 when unknown.
    pub rss_kib: u64,
    /// Highest resident so far (VmHWM), KiB; 0 when unknown.
    pub peak_rss_kib: u64,
}

impl Usage {
    pub fn cpu_secs(&self) -> f64 {
        self.user_secs + self.system_secs
    }
}

/// This process's usage: CPU from getrusage, memory from /proc/self/status.
pub fn own() -> Usage {
    let mut out = Usage::default();
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct we pass, which is ours and zeroed.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0 {
        // SAFETY: initialized by the successful call above.
        let u = unsafe { usage.assume_init() };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        out.user_secs = secs(u.ru_utime);
        out.system_secs = secs(u.ru_stime);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    out.rss_kib = field("VmRSS:");
    out.peak_rss_kib = field("VmHWM:");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_memory_and_a_peak_at_least_as_high() {
        let u = super::own();
        assert!(u.rss_kib > 0 && u.peak_rss_kib >= u.rss_kib, "{u:?}");
        assert!(u.cpu_secs() >= 0.0);
    }
}
