//! Indexes of the per-CPU COUNTERS array: every failure to record is
//! counted here, and the report shows each counter.

/// An event could not be reserved in the ring buffer.
pub const RINGBUF_FULL: u32 = 0;
/// An allocation could not be inserted into the LIVE map.
pub const LIVE_MAP_FULL: u32 = 1;
/// `bpf_get_stackid` failed (stack map full or hash bucket taken).
pub const STACK_LOST: u32 = 2;
/// free() of an address not in the LIVE map: a block allocated before
/// the trace started, or allocator-internal memory (glibc's per-thread
/// cache and the blocks in it, handed back at thread exit), or one not
/// tracked (LIVE full). Not counted when sampling.
pub const UNKNOWN_FREE: u32 = 3;
/// A return probe fired without a matching entry (attached mid-call).
pub const RETURN_WITHOUT_ENTRY: u32 = 4;
/// The entry could not be remembered for the return probe.
pub const INFLIGHT_FULL: u32 = 5;
/// posix_memalign's result could not be read from `*memptr`.
pub const READ_FAILED: u32 = 6;
/// An in-flight record whose return was never seen was discarded (a
/// thread that died inside the allocator, or a probe detached mid-call).
pub const STALE_INFLIGHT: u32 = 7;
/// Without --follow-forks: child processes that a traced process
/// (--pid, or a command) forked, which are not traced. Not a loss: the
/// report says how many, and how to trace them.
pub const CHILD_NOT_TRACED: u32 = 8;
/// With --follow-forks: children that could not join the traced set
/// (the filter map was full, or the child's task could not be read).
pub const CHILD_NOT_FOLLOWED: u32 = 9;
/// An allocator call made by a signal handler while its thread already
/// had INFLIGHT_FRAMES calls in flight (handlers interrupting allocator
/// calls, one inside the other): not recorded.
pub const NESTED_LOST: u32 = 10;
/// A FREE event dropped because the ring buffer was full (also counted
/// in RINGBUF_FULL): the block stays in use in user space's model.
pub const FREE_DROPPED: u32 = 11;
/// free() of a block whose ALLOC event was dropped (see
/// `LiveValue::unreported`): not an unknown free.
pub const FREE_OF_DROPPED_ALLOC: u32 = 12;
/// Tables mode: stacks cut at MAX_FRAMES (kept, marked truncated).
pub const UNWIND_TRUNCATED: u32 = 13;
/// Tables mode: a row the walker cannot follow (CFA from another
/// register or expression, return address elsewhere, an offset that
/// does not fit): the stack ends there, marked truncated.
pub const UNWIND_UNSUPPORTED: u32 = 14;
/// Tables mode: a user-memory read failed during the walk.
pub const UNWIND_READ_FAILED: u32 = 15;
/// Tables mode: a frame-pointer step with no usable RBP, or a frame
/// that did not move up the stack.
pub const UNWIND_BAD_FRAME: u32 = 16;
/// Tables mode: frames taken by the frame-pointer chain (no table for
/// the address; information, not a loss).
pub const UNWIND_FP_STEPS: u32 = 17;
/// Tables mode: walks that met an address no mapping describes yet and
/// handed a stack copy to user space (information, not a loss).
pub const UNWIND_RESUMED: u32 = 18;
/// Uprobe sessions: return runs of the allocating functions in traced
/// processes, i.e. calls whose entry asked for their return (recorded
/// ones, and resizing calls that may free a recorded block). Information,
/// not a loss: without sessions every call has its return run, uncounted.
pub const RETURN_RUNS: u32 = 19;
/// Uprobe sessions: return runs in processes that are not traced (the
/// probes of --binary, --cgroup, system-wide and --follow-forks fire for
/// every process mapping the file): none but calls entered while the
/// session link was being set up. Information, not a loss.
pub const RETURN_RUNS_UNTRACED: u32 = 20;
/// Bytes the frees counted in UNKNOWN_FREE handed back, where the
/// allocator's block header tells a block's size (glibc: the chunk
/// header's size, less the header). Information, not a loss: with the
/// traced in-use bytes it tells whether the heap as a whole grows.
pub const UNKNOWN_FREE_BYTES: u32 = 21;
/// Number of counters.
pub const COUNT: u32 = 22;
