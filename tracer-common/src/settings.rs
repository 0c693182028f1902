//! A trace's settings as the BPF programs read them from the SETTINGS map
//! when they were loaded before the trace was known (`SETTINGS_IN_MAP`):
//! the agent keeps programs verified ahead of a request and gives them
//! their target and sample rate when one comes. A trace whose programs are
//! loaded for it has the same values as read-only globals instead, which
//! the verifier reads as constants and prunes by.

/// Index 0 of the SETTINGS array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSettings {
    /// Mean bytes between recorded allocations; 1 records every one.
    pub sample_rate: u64,
    /// `FILTER_*`.
    pub filter: u32,
    /// FILTER_CGROUP: the traced subtree's depth.
    pub cgroup_level: u32,
    /// `FORKS_*`.
    pub follow_forks: u32,
    pub _pad: u32,
    /// FILTER_ALL: only threads of this name (NUL-padded), if not empty.
    pub comm: [u8; 16],
}

impl TraceSettings {
    /// What programs loaded ahead read until a trace is given to them: a
    /// pid-set filter with an empty set, which records nothing.
    pub const IDLE: TraceSettings = TraceSettings {
        sample_rate: 1,
        filter: crate::FILTER_PIDS,
        cgroup_level: 0,
        follow_forks: crate::FORKS_COUNT,
        _pad: 0,
        comm: [0; 16],
    };
}

#[cfg(feature = "user")]
// SAFETY: #[repr(C)], integers only, and `_pad` fills the one gap.
unsafe impl aya::Pod for TraceSettings {}

#[cfg(test)]
mod tests {
    #[test]
    fn has_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<super::TraceSettings>(), 40);
    }
}
