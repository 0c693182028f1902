//! How stacks are captured and probes attached, and the maps' sizes: chosen
//! on the command line, read by the loader, the attach plan and the report.

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum UnwindMode {
    /// Copy registers and stack bytes, unwind with DWARF CFI in user space:
    /// complete stacks without frame pointers.
    #[default]
    Dwarf,
    /// Frame-pointer walk in the kernel: cheaper, complete only through code
    /// built with frame pointers.
    Fp,
    /// Walk in the kernel from unwind tables built from each file's
    /// .eh_frame/.debug_frame: complete stacks without frame pointers and
    /// without a stack-size window; events carry return addresses only.
    Tables,
}

impl UnwindMode {
    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Dwarf => "dwarf",
            UnwindMode::Fp => "fp",
            UnwindMode::Tables => "tables",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ProbePlacement {
    /// On the first instruction the kernel emulates, when that is safe
    /// (about 1 µs per hit instead of 10–19 µs for a single-stepped one).
    #[default]
    Emulated,
    /// At each function's symbol, as other tracers do.
    Entry,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Sessions {
    #[default]
    Auto,
    Off,
}

/// Map sizes and tunables chosen on the command line.
#[derive(Clone, Copy)]
pub struct Limits {
    pub max_live: u32,
    pub stack_storage_size: u32,
    pub ringbuf_bytes: u32,
    pub unwind: UnwindMode,
    pub stack_bytes: u32,
    /// Entries of UNWIND_ROWS (`--unwind tables`).
    pub unwind_rows: u32,
    pub sampling: crate::profile::Sampling,
    /// tracer_common::FILTER_* and, for FILTER_ALL, the thread name.
    pub filter: u32,
    pub comm: [u8; 16],
    /// --follow-forks: children of traced processes join the traced set.
    pub follow_forks: bool,
    /// FILTER_CGROUP: the traced subtree's root (id, depth).
    pub cgroup: CgroupFilter,
    /// The programs read the trace's settings (sampling and filter) from
    /// the SETTINGS map: loaded ahead of the trace (loader/ahead.rs).
    pub settings_in_map: bool,
}

impl Limits {
    /// The trace's settings as the SETTINGS map holds them.
    pub fn trace_settings(&self) -> tracer_common::TraceSettings {
        tracer_common::TraceSettings {
            sample_rate: self.sampling.rate(),
            filter: self.filter,
            cgroup_level: self.cgroup.level,
            follow_forks: if self.follow_forks {
                tracer_common::FORKS_FOLLOW
            } else {
                tracer_common::FORKS_COUNT
            },
            _pad: 0,
            comm: self.comm,
        }
    }

    /// Whether programs loaded with `self` (ahead of any trace) serve a
    /// trace of `trace`: the same sizes and unwinding; the trace's settings
    /// are given to them in the map.
    pub fn serves(&self, trace: &Limits) -> bool {
        self.settings_in_map
            && self.max_live == trace.max_live
            && self.stack_storage_size == trace.stack_storage_size
            && self.ringbuf_bytes == trace.ringbuf_bytes
            && self.unwind == trace.unwind
            && self.stack_bytes == trace.stack_bytes
            && self.unwind_rows == trace.unwind_rows
    }
}

/// `--cgroup`: the cgroup v2 id of the subtree's root (its directory's
/// inode number) and its depth below the hierarchy's root (tracer-ebpf's
/// CGROUP map and CGROUP_LEVEL). Zero without --cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupFilter {
    pub id: u64,
    pub level: u32,
}
