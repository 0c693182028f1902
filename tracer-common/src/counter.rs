//! The per-CPU COUNTERS array: every failure to record is counted here.
//! One table, `TABLE`, defines each counter once: its index (the constant
//! the BPF programs `count`), its name in the report, the JSON `losses`
//! object and /metrics, what it means and, for a loss, how to avoid it.
//! User space reads, prints, serializes and checks the counters by
//! walking the table; a new counter is one row of `counters!` below.

/// What a counter is to the report. Reports print the counters of the
/// JSON `losses` object class by class (losses, details, information),
/// each in table order; the JSON object keeps table order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Data missing from the report: summed as lost, printed with its
    /// remedy.
    Loss,
    /// Detail of a loss (what some of its events were).
    Detail,
    /// Information, not a loss.
    Info,
    /// Not in the report's losses: user space reads it for something
    /// else (fork notes, unwind notes, --verbose).
    Other,
}

/// One counter of the table.
#[derive(Clone, Copy, Debug)]
pub struct Counter {
    /// Its slot in the COUNTERS array.
    pub index: u32,
    /// Its name in the report, the JSON `losses` object and /metrics
    /// (`Class::Other`: in the docs only).
    pub name: &'static str,
    pub class: Class,
    /// What a count means, as the report says it.
    pub meaning: &'static str,
    /// The flag that raises the limit behind a loss, or its usual cause
    /// when no flag helps.
    pub remedy: Option<&'static str>,
}

impl Counter {
    /// Whether the report's `losses` (text, JSON, pprof, /metrics) show it.
    pub const fn reported(&self) -> bool {
        !matches!(self.class, Class::Other)
    }
}

/// Defines each counter's index constant (with its doc comment) and its
/// row of `TABLE`, in the order given.
macro_rules! counters {
    ($(
        $(#[$doc:meta])*
        $konst:ident = $index:literal, $name:literal, $class:ident,
            $meaning:literal $(, remedy: $remedy:literal)?;
    )*) => {
        $( $(#[$doc])* pub const $konst: u32 = $index; )*

        /// Number of counters.
        pub const COUNT: u32 = [$($index),*].len() as u32;

        /// Every counter: the report's `losses` in JSON order, then the
        /// others.
        pub const TABLE: [Counter; COUNT as usize] = [$(Counter {
            index: $index,
            name: $name,
            class: Class::$class,
            meaning: $meaning,
            remedy: counters!(@remedy $($remedy)?),
        }),*];
    };
    (@remedy $remedy:literal) => { Some($remedy) };
    (@remedy) => { None };
}

counters! {
    /// An event could not be reserved in the ring buffer.
    RINGBUF_FULL = 0, "ringbuf_full", Loss,
        "events dropped because the ring buffer was full",
        remedy: "raise --ringbuf-mb";
    /// An allocation could not be inserted into the LIVE map.
    LIVE_MAP_FULL = 1, "live_map_full", Loss,
        "allocations not tracked because the live map was full",
        remedy: "raise --max-live";
    /// `bpf_get_stackid` failed (stack map full or hash bucket taken).
    STACK_LOST = 2, "stack_lost", Loss,
        "allocations recorded without a call stack",
        remedy: "raise --stack-storage-size";
    /// free() of an address not in the LIVE map: a block allocated before
    /// the trace started, or allocator-internal memory (glibc's per-thread
    /// cache and the blocks in it, handed back at thread exit), or one not
    /// tracked (LIVE full). Not counted when sampling.
    UNKNOWN_FREE = 3, "unknown_frees", Info,
        "frees of blocks the trace never saw allocated (not a loss; see notes)";
    /// Bytes the frees counted in UNKNOWN_FREE handed back, where the
    /// allocator's block header tells a block's size (glibc: the chunk
    /// header's size, less the header). Information, not a loss: with the
    /// traced in-use bytes it tells whether the heap as a whole grows.
    UNKNOWN_FREE_BYTES = 21, "unknown_free_bytes", Info,
        "bytes those frees handed back (glibc's chunk sizes, exact mode; 0 where unknown)";
    /// A return probe fired without a matching entry (attached mid-call).
    RETURN_WITHOUT_ENTRY = 4, "return_without_entry", Info,
        "returns of calls begun while probes were being attached (not a loss)";
    /// The entry could not be remembered for the return probe.
    INFLIGHT_FULL = 5, "inflight_full", Loss,
        "allocator calls whose entry could not be remembered",
        remedy: "cause: many threads inside the allocator at once";
    /// posix_memalign's result could not be read from `*memptr`.
    READ_FAILED = 6, "read_failed", Loss,
        "posix_memalign results that could not be read";
    /// An in-flight record whose return was never seen was discarded (a
    /// thread that died inside the allocator, or a probe detached mid-call).
    STALE_INFLIGHT = 7, "stale_inflight", Loss,
        "allocator calls whose return was never seen",
        remedy: "cause: threads that died inside the allocator";
    /// An allocator call made by a signal handler while its thread already
    /// had INFLIGHT_FRAMES calls in flight (handlers interrupting allocator
    /// calls, one inside the other): not recorded.
    NESTED_LOST = 10, "nested_lost", Loss,
        "allocator calls of signal handlers nested too deep in interrupted allocator calls",
        remedy: "cause: signal handlers interrupting each other's allocations";
    /// A FREE event dropped because the ring buffer was full (also counted
    /// in RINGBUF_FULL): the block stays in use in user space's model.
    FREE_DROPPED = 11, "frees_dropped", Detail,
        "of ringbuf_full, frees: their blocks still count as in use (in-use overstated)";
    /// free() of a block whose ALLOC event was dropped (see
    /// `LiveValue::unreported`): not an unknown free.
    FREE_OF_DROPPED_ALLOC = 12, "frees_of_dropped_allocs", Detail,
        "frees of blocks whose allocation event was dropped (see ringbuf_full; not unknown)";
    /// Without --follow-forks: child processes that a traced process
    /// (--pid, or a command) forked, which are not traced. Not a loss: the
    /// report says how many, and how to trace them.
    CHILD_NOT_TRACED = 8, "child_not_traced", Other,
        "children of traced processes, not traced (see the notes)";
    /// With --follow-forks: children that could not join the traced set
    /// (the filter map was full, or the child's task could not be read).
    CHILD_NOT_FOLLOWED = 9, "child_not_followed", Other,
        "children that could not join the traced set (see the notes)";
    /// Tables mode: stacks cut at MAX_FRAMES (kept, marked truncated).
    UNWIND_TRUNCATED = 13, "unwind_truncated", Other,
        "stacks cut at the deepest frame walked (see the notes)";
    /// Tables mode: a row the walker cannot follow (CFA from another
    /// register or expression, return address elsewhere, an offset that
    /// does not fit): the stack ends there, marked truncated.
    UNWIND_UNSUPPORTED = 14, "unwind_unsupported", Other,
        "stacks ended at a rule the walker cannot follow (see the notes)";
    /// Tables mode: a user-memory read failed during the walk.
    UNWIND_READ_FAILED = 15, "unwind_read_failed", Other,
        "stacks ended at a failed read (see the notes)";
    /// Tables mode: a frame-pointer step with no usable RBP, or a frame
    /// that did not move up the stack.
    UNWIND_BAD_FRAME = 16, "unwind_bad_frame", Other,
        "stacks ended at a bad frame (see the notes)";
    /// Tables mode: frames taken by the frame-pointer chain (no table for
    /// the address; information, not a loss).
    UNWIND_FP_STEPS = 17, "unwind_fp_steps", Other,
        "frames taken by the frame-pointer chain (--verbose)";
    /// Tables mode: walks that met an address no mapping describes yet and
    /// handed a stack copy to user space (information, not a loss).
    UNWIND_RESUMED = 18, "unwind_resumed", Other,
        "walks handed to user space (--verbose)";
    /// Uprobe sessions: return runs of the allocating functions in traced
    /// processes, i.e. calls whose entry asked for their return (recorded
    /// ones, and resizing calls that may free a recorded block). Information,
    /// not a loss: without sessions every call has its return run, uncounted.
    RETURN_RUNS = 19, "return_runs", Other,
        "return runs in traced processes (--verbose)";
    /// Uprobe sessions: return runs in processes that are not traced (the
    /// probes of --binary, --cgroup, system-wide and --follow-forks fire for
    /// every process mapping the file): none but calls entered while the
    /// session link was being set up. Information, not a loss.
    RETURN_RUNS_UNTRACED = 20, "return_runs_untraced", Other,
        "return runs in processes not traced (--verbose)";
}

/// Number of counters the report's `losses` show.
pub const REPORTED: usize = {
    let mut n = 0;
    let mut i = 0;
    while i < TABLE.len() {
        if TABLE[i].reported() {
            n += 1;
        }
        i += 1;
    }
    n
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_is_in_the_table_once() {
        for i in 0..COUNT {
            let rows = TABLE.iter().filter(|c| c.index == i).count();
            assert_eq!(rows, 1, "index {i}");
        }
    }

    #[test]
    fn names_are_unique_json_keys() {
        for c in &TABLE {
            assert_eq!(
                TABLE.iter().filter(|d| d.name == c.name).count(),
                1,
                "{}",
                c.name
            );
            assert!(
                c.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                c.name
            );
            assert!(!c.meaning.is_empty(), "{}", c.name);
        }
    }

    #[test]
    fn only_losses_have_remedies_and_the_others_come_last() {
        for c in &TABLE {
            if c.remedy.is_some() {
                assert_eq!(c.class, Class::Loss, "{}", c.name);
            }
        }
        let first_other = TABLE.iter().position(|c| !c.reported());
        assert_eq!(first_other, Some(REPORTED));
        assert!(TABLE[REPORTED..].iter().all(|c| !c.reported()));
    }
}
