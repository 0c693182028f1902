//! What the running kernel's BPF offers, read by name from its own BTF
//! (the enumerators of `enum bpf_map_type`, `bpf_func_id` and
//! `bpf_attach_type`), not guessed from its version number: distribution
//! kernels backport features, and the names are what the verifier and
//! `bpf()` accept.

use anyhow::{bail, Context as _};

use super::kernel_btf::Btf;

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The features the tracer picks its mode from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// Task-local storage maps (5.11): a thread's calls in flight live
    /// there; without them, in a hash map keyed by thread id.
    pub task_storage: bool,
    /// `bpf_get_attach_cookie` (5.15): session probes placed past an
    /// instruction that moved an argument find it by their cookie.
    pub attach_cookie: bool,
    /// uprobe_multi links (6.6): free is hooked by one.
    pub uprobe_multi: bool,
    /// uprobe session programs (6.13): unrecorded calls skip the return.
    pub uprobe_session: bool,
}

impl KernelFeatures {
    /// Reads them from /sys/kernel/btf/vmlinux. A kernel without BTF, or
    /// without what every mode needs, is refused with what is missing.
    pub fn probe() -> anyhow::Result<KernelFeatures> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|r| r.trim().to_string())
            .unwrap_or_else(|_| "(unknown release)".into());
        let data = std::fs::read(VMLINUX_BTF).with_context(|| {
            format!(
                "kernel {release} has no BTF ({VMLINUX_BTF}): memtrace-bpf needs a kernel \
                 built with CONFIG_DEBUG_INFO_BTF (every major distribution's kernel since \
                 about 2021 is)"
            )
        })?;
        let btf = Btf::parse(&data).with_context(|| format!("parsing {VMLINUX_BTF}"))?;
        Self::from_btf(release, &btf)
    }

    fn from_btf(release: String, btf: &Btf<'_>) -> anyhow::Result<KernelFeatures> {
        // What every mode needs, with the release that brought it.
        let required = [
            ("BPF_MAP_TYPE_RINGBUF", "BPF ring buffers (5.8)"),
            ("BPF_FUNC_probe_read_user", "bpf_probe_read_user (5.5)"),
            (
                "BPF_FUNC_get_current_ancestor_cgroup_id",
                "cgroup ancestry (5.7)",
            ),
        ];
        let missing: Vec<&str> = required
            .iter()
            .filter(|(name, _)| !btf.has_enumerator(name))
            .map(|(_, what)| *what)
            .collect();
        if !missing.is_empty() {
            bail!(
                "kernel {release} lacks {}: memtrace-bpf runs on Linux 5.10 and later",
                missing.join(", ")
            );
        }
        Ok(KernelFeatures {
            task_storage: btf.has_enumerator("BPF_MAP_TYPE_TASK_STORAGE"),
            attach_cookie: btf.has_enumerator("BPF_FUNC_get_attach_cookie"),
            uprobe_multi: btf.has_enumerator("BPF_TRACE_UPROBE_MULTI"),
            uprobe_session: btf.has_enumerator("BPF_TRACE_UPROBE_SESSION"),
            release,
        })
    }

    /// How calls in flight are kept, for the mode line.
    pub fn inflight_words(&self) -> &'static str {
        if self.task_storage {
            "calls in flight in task storage"
        } else {
            "calls in flight in a hash map by thread (no task storage before 5.11)"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_kernel_has_what_every_mode_needs() {
        // This machine's kernel (6.18) has all of them.
        let f = KernelFeatures::probe().expect("features");
        assert!(f.task_storage && f.attach_cookie && f.uprobe_multi && f.uprobe_session);
        assert!(!f.release.is_empty());
    }
}
