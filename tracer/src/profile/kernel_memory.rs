//! What the kernel counted of a process's (or the traced cgroup's) memory
//! over the trace, beside the traced heap, and how much of its growth the
//! heap accounts for (docs/growth.md#the-growth-explained).

use serde::{Deserialize, Serialize};

/// The kernel's numbers at the start of the trace, at their highest and at
/// the end (or the last reading before the process exited).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct KernelMemory {
    /// Where they were read: "status" (/proc/PID/status), "cgroup v2" or
    /// "cgroup v1".
    pub source: String,
    pub start: MemorySample,
    /// The reading with the highest resident bytes.
    pub peak: MemorySample,
    pub end: MemorySample,
    /// Readings taken (about one a second).
    pub readings: u64,
    /// The growth from start to end explained; null when the report was
    /// built without the heap's numbers for it (a group of several
    /// processes, a file saved before).
    pub growth: Option<GrowthExplained>,
}

/// One reading, in bytes (see `tracee::memory::MemoryUse`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct MemorySample {
    /// Seconds since the trace started.
    pub secs: f64,
    pub resident_bytes: u64,
    pub anon_bytes: u64,
    pub file_bytes: u64,
    pub swap_bytes: u64,
}

impl MemorySample {
    /// Anonymous memory, resident or swapped out.
    pub fn anon_total(&self) -> u64 {
        self.anon_bytes.saturating_add(self.swap_bytes)
    }
}

/// How the memory grew from start to end, and how much of it the traced
/// heap accounts for. Signed: memory may also shrink.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct GrowthExplained {
    pub resident_growth_bytes: i64,
    /// Anonymous memory, resident or swapped out: where a heap grows.
    pub anon_growth_bytes: i64,
    pub file_growth_bytes: i64,
    /// The traced heap's growth over the same window: the blocks allocated
    /// during the trace and still live, less what frees of older blocks
    /// handed back where that is known (one glibc process, exact mode).
    pub heap_growth_bytes: i64,
    /// The share of the anonymous growth the heap accounts for (0 to 1);
    /// null when anonymous memory grew by less than `MIN_GROWTH`.
    pub heap_share: Option<f64>,
    /// Of the anonymous growth the heap does not account for, what its
    /// peak held that was freed by the end (memory the allocator may keep).
    pub allocator_retained_bytes: u64,
    /// The rest of it: anonymous memory the hooked allocator did not hand
    /// out (mmap outside malloc, thread stacks, JIT code, another allocator).
    pub other_anon_bytes: u64,
}

/// Anonymous growth below this is not explained: a few pages come and go
/// with any program's stacks and buffers.
pub const MIN_GROWTH: u64 = 1 << 20;
