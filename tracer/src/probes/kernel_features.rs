//! What the running kernel's BPF offers, read by name from its own BTF
//! (the enumerators of `enum bpf_map_type`, `bpf_func_id` and
//! `bpf_attach_type`), not guessed from its version number: distribution
//! kernels backport features, and the names are what the verifier and
//! `bpf()` accept.

use std::os::fd::{FromRawFd as _, OwnedFd};

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
    /// BPF atomic fetch operations (5.12): programs take their scratch
    /// slot with one (tracer-ebpf scratch.rs). Probed by loading a program
    /// that uses one: atomics are instructions, not named in the BTF.
    pub atomics: bool,
    /// Whether the verifier offers `bpf_get_current_ancestor_cgroup_id`
    /// to kprobe-type programs, uprobes among them: `--cgroup`'s filter
    /// asks it. Without it `--cgroup` follows the subtree by its process
    /// list (session/cgroup_members.rs). Probed by loading a program that
    /// calls it: the helper is named in the BTF of kernels that refuse it
    /// to these programs (Debian's 5.10), and backports move the release.
    pub ancestor_cgroup: bool,
    /// The BTF ids of the kfuncs bpf_preempt_disable and
    /// bpf_preempt_enable (6.10), which every uprobe program calls around
    /// its body (tracer-ebpf scratch.rs), on kernels that give programs a
    /// per-CPU private stack (6.13, `bpf_prog_aux.priv_stack_requested`),
    /// where a preempted uprobe program would share it; None elsewhere
    /// (the calls become no-ops).
    pub preempt_kfuncs: Option<(u32, u32)>,
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
        let mut features = Self::from_btf(release, &btf)?;
        features.atomics = verifier_takes_atomic_fetch();
        features.ancestor_cgroup = verifier_offers_ancestor_cgroup();
        Ok(features)
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
            atomics: false,
            ancestor_cgroup: false,
            preempt_kfuncs: btf
                .member_offset("bpf_prog_aux", "priv_stack_requested")
                .and_then(|_| btf.function_id("bpf_preempt_disable"))
                .zip(btf.function_id("bpf_preempt_enable")),
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

/// Whether the kernel loads a socket filter doing an atomic fetch-or on
/// its stack: `*(u64 *)(r10 - 8) = 0; r1 = 1; r1 = atomic_fetch_or(
/// (u64 *)(r10 - 8), r1); r0 = 0; exit`.
fn verifier_takes_atomic_fetch() -> bool {
    const BPF_PROG_TYPE_SOCKET_FILTER: u64 = 1;
    verifier_loads(
        BPF_PROG_TYPE_SOCKET_FILTER,
        &[
            (0x7a, 10, -8, 0),             // *(u64 *)(r10 - 8) = 0
            (0xb7, 1, 0, 1),               // r1 = 1
            (0xdb, 10 | 1 << 4, -8, 0x41), // r1 = atomic_fetch_or((u64 *)(r10 - 8), r1)
            (0xb7, 0, 0, 0),               // r0 = 0
            (0x95, 0, 0, 0),               // exit
        ],
    )
}

/// Whether the kernel loads a kprobe program calling
/// bpf_get_current_ancestor_cgroup_id: `r1 = 0; call 123; r0 = 0; exit`.
/// 5.10 answers "unknown func bpf_get_current_ancestor_cgroup_id#123".
fn verifier_offers_ancestor_cgroup() -> bool {
    const BPF_PROG_TYPE_KPROBE: u64 = 2;
    const BPF_FUNC_GET_CURRENT_ANCESTOR_CGROUP_ID: i32 = 123;
    verifier_loads(
        BPF_PROG_TYPE_KPROBE,
        &[
            (0xb7, 1, 0, 0), // r1 = 0
            (0x85, 0, 0, BPF_FUNC_GET_CURRENT_ANCESTOR_CGROUP_ID),
            (0xb7, 0, 0, 0), // r0 = 0
            (0x95, 0, 0, 0), // exit
        ],
    )
}

/// Whether bpf(BPF_PROG_LOAD) takes a GPL program of type `prog_type`
/// made of `insns`: (code, dst | src << 4, off, imm) per instruction. The
/// program is closed at once; kprobe programs are attached to nothing.
fn verifier_loads(prog_type: u64, insns: &[(u8, u8, i16, i32)]) -> bool {
    const BPF_PROG_LOAD: libc::c_long = 5;
    let code: Vec<u64> = insns
        .iter()
        .map(|&(op, regs, off, imm)| {
            u64::from(op)
                | u64::from(regs) << 8
                | u64::from(off as u16) << 16
                | u64::from(imm as u32) << 32
        })
        .collect();
    let license = b"GPL\0";
    let mut attr = [0u64; 16];
    attr[0] = prog_type | ((code.len() as u64) << 32);
    attr[1] = code.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    super::uprobe_session::bpf(BPF_PROG_LOAD, &mut attr)
        // SAFETY: a new fd that we own; dropping it closes it.
        .map(|fd| drop(unsafe { OwnedFd::from_raw_fd(fd) }))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_kernel_has_what_every_mode_needs() {
        // This machine's kernel (6.18) has all of them.
        let f = KernelFeatures::probe().expect("features");
        assert!(f.task_storage && f.attach_cookie && f.uprobe_multi && f.uprobe_session);
        assert!(f.atomics, "6.18's verifier takes atomic fetch-or");
        assert!(
            f.ancestor_cgroup,
            "6.18 offers bpf_get_current_ancestor_cgroup_id to uprobes"
        );
        assert!(f.preempt_kfuncs.is_some(), "6.18 has bpf_preempt_disable");
        assert!(!f.release.is_empty());
    }

    /// The probe tells a helper the verifier refuses from one it takes:
    /// helper ids past the kernel's last are unknown funcs, as 5.10's
    /// answer to bpf_get_current_ancestor_cgroup_id in kprobe programs.
    #[test]
    fn a_program_calling_a_helper_the_kernel_lacks_does_not_load() {
        let call =
            |helper| verifier_loads(2, &[(0xb7, 1, 0, 0), (0x85, 0, 0, helper), (0x95, 0, 0, 0)]);
        assert!(call(123), "bpf_get_current_ancestor_cgroup_id");
        assert!(!call(100_000), "no helper has that id");
    }
}
