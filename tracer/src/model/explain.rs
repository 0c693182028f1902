//! How much of a process's (or cgroup's) memory growth its traced heap
//! accounts for, and what the kernel's numbers say the rest is. Pure.
//!
//! Anonymous memory (resident or swapped out) is where a heap grows. Of
//! its growth from the first reading to the last:
//! - the heap's own growth explains up to all of it;
//! - what the heap held at its peak and freed by the end is memory the
//!   allocator may keep (glibc rarely gives the top of its arenas back):
//!   it explains the rest up to that amount;
//! - what is left is anonymous memory the hooked allocator never handed
//!   out: mmap calls outside malloc, thread stacks, JIT code.
//!
//! File-backed growth (mapped files, shared memory, a cgroup's page
//! cache) is said apart: it is no heap.

use crate::profile::{GrowthExplained, MemorySample, MIN_GROWTH};

/// The heap's side of the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapWindow {
    /// Its growth: see `GrowthExplained::heap_growth_bytes`.
    pub growth: i64,
    /// What it held at its peak (of the blocks allocated during the trace).
    pub peak: u64,
    /// What it holds at the end (of the same blocks).
    pub end: u64,
}

pub fn explain(start: &MemorySample, end: &MemorySample, heap: HeapWindow) -> GrowthExplained {
    let anon = diff(end.anon_total(), start.anon_total());
    let unexplained = u64::try_from(anon - heap.growth.max(0)).unwrap_or(0);
    let retained = unexplained.min(heap.peak.saturating_sub(heap.end));
    let heap_share = (anon >= MIN_GROWTH as i64).then(|| {
        let share = heap.growth.max(0) as f64 / anon as f64;
        share.clamp(0.0, 1.0)
    });
    GrowthExplained {
        resident_growth_bytes: diff(end.resident_bytes, start.resident_bytes),
        anon_growth_bytes: anon,
        file_growth_bytes: diff(end.file_bytes, start.file_bytes),
        heap_growth_bytes: heap.growth,
        heap_share,
        allocator_retained_bytes: retained,
        other_anon_bytes: unexplained - retained,
    }
}

/// `a - b`, saturating at i64's bounds.
pub fn diff(a: u64, b: u64) -> i64 {
    let d = i128::from(a) - i128::from(b);
    i64::try_from(d).unwrap_or(if d < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn sample(resident: u64, anon: u64, swap: u64) -> MemorySample {
        MemorySample {
            secs: 0.0,
            resident_bytes: resident,
            anon_bytes: anon,
            file_bytes: resident - anon,
            swap_bytes: swap,
        }
    }

    #[test]
    fn a_heap_that_grew_as_much_as_anonymous_memory_explains_all_of_it() {
        let g = explain(
            &sample(10 * MIB, 4 * MIB, 0),
            &sample(50 * MIB, 44 * MIB, 0),
            HeapWindow {
                growth: 39 * MIB as i64,
                peak: 39 * MIB,
                end: 39 * MIB,
            },
        );
        assert_eq!(g.anon_growth_bytes, 40 * MIB as i64);
        assert_eq!(g.file_growth_bytes, 0);
        assert!((g.heap_share.unwrap() - 39.0 / 40.0).abs() < 1e-9, "{g:?}");
        assert_eq!(g.other_anon_bytes, MIB);
    }

    #[test]
    fn mmap_growth_is_other_anonymous_memory_and_freed_peaks_are_retention() {
        // Grew 64 MiB through mmap; the heap rose to 8 MiB and fell to 1.
        let g = explain(
            &sample(10 * MIB, 4 * MIB, 0),
            &sample(82 * MIB, 76 * MIB, 0),
            HeapWindow {
                growth: MIB as i64,
                peak: 8 * MIB,
                end: MIB,
            },
        );
        assert_eq!(g.anon_growth_bytes, 72 * MIB as i64);
        assert!(g.heap_share.unwrap() < 0.02, "{g:?}");
        assert_eq!(g.allocator_retained_bytes, 7 * MIB);
        assert_eq!(g.other_anon_bytes, 64 * MIB);
    }

    #[test]
    fn swapped_out_memory_still_counts_and_small_growth_is_not_explained() {
        // Anonymous resident fell, but the swap rose by more.
        let g = explain(
            &sample(40 * MIB, 30 * MIB, 0),
            &sample(30 * MIB, 20 * MIB, 20 * MIB),
            HeapWindow {
                growth: 10 * MIB as i64,
                peak: 10 * MIB,
                end: 10 * MIB,
            },
        );
        assert_eq!(g.anon_growth_bytes, 10 * MIB as i64);
        assert_eq!(g.heap_share, Some(1.0));
        let small = explain(
            &sample(10 * MIB, 4 * MIB, 0),
            &sample(10 * MIB, 4 * MIB + 4096, 0),
            HeapWindow::default(),
        );
        assert_eq!(small.heap_share, None);
        assert_eq!(small.other_anon_bytes, 4096);
        // Shrinking memory leaves nothing to explain.
        let shrunk = explain(
            &sample(50 * MIB, 40 * MIB, 0),
            &sample(20 * MIB, 10 * MIB, 0),
            HeapWindow {
                growth: -(5 * MIB as i64),
                peak: 0,
                end: 0,
            },
        );
        assert_eq!(shrunk.anon_growth_bytes, -(30 * MIB as i64));
        assert_eq!((shrunk.heap_share, shrunk.other_anon_bytes), (None, 0));
        assert_eq!(diff(0, u64::MAX), i64::MIN);
    }
}
