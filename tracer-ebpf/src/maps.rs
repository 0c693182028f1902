//! The maps shared with user space, the tunables the loader sets before
//! loading, and the small helpers every program uses on them (counting a
//! loss, the trace filter, the stop flag, ring-buffer wakeups).

use aya_ebpf::{
    bindings::{bpf_map_type, BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE, BPF_NOEXIST},
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_ktime_get_ns,
        generated::{
            bpf_get_current_task_btf, bpf_map_delete_elem, bpf_map_lookup_elem,
            bpf_map_update_elem, bpf_task_storage_get,
        },
    },
    macros::{btf_map, map},
    maps::{Array, HashMap, PerCpuArray, ProgramArray, RingBuf, StackTrace},
};
use tracer_common::{
    counter, Event, EventKind, InFlight, InFlightStack, LiveKey, LiveValue, Role, CONTROL_SESSION,
    CONTROL_STOPPED, EXP_TABLE_LEN, FILTER_ALL, FILTER_CGROUP, FILTER_NONE, FILTER_PIDS,
    INFLIGHT_FRAMES, STATE_SLOTS, UNWIND_FP,
};

pub(crate) use crate::settings::tunable;
use crate::settings::{cgroup_helper, cgroup_level, comm, filter};

// Sizes here are defaults; user space sets the real ones with
// `EbpfLoader::set_max_entries` from --max-live, --stack-storage-size and
// --ringbuf-mb.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(16 << 20, 0);
#[map]
pub(crate) static LIVE: HashMap<LiveKey, LiveValue> =
    HashMap::with_max_entries(1 << 20, BPF_F_NO_PREALLOC);
#[map]
pub(crate) static STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);
/// Each thread's allocator calls in flight (see inflight.rs): task-local
/// storage, created at the thread's first traced call and freed by the
/// kernel with the thread, so threads bound it. A lookup reads the task's
/// own storage list, which is cheaper than the hash lookup (jhash, bucket
/// walk, LRU reference bit) a map keyed by thread id costs at every entry
/// and return. Kernels without task storage (before 5.11) get a hash map
/// keyed by thread id instead: the loader rewrites this definition's type
/// and sets INFLIGHT_BY_TID, and process_exit deletes a thread's entry.
#[btf_map]
pub(crate) static INFLIGHT: TaskStorage<InFlightStack> = TaskStorage::new();

/// 1 when the kernel has bpf_get_attach_cookie (5.15+); set at load time.
#[unsafe(no_mangle)]
pub(crate) static ATTACH_COOKIES: u32 = 0;

/// 1 when INFLIGHT is a hash map keyed by thread id; set at load time.
#[unsafe(no_mangle)]
pub(crate) static INFLIGHT_BY_TID: u32 = 0;

/// A `BPF_MAP_TYPE_TASK_STORAGE` map, which aya-ebpf 0.2 does not define:
/// a BTF map definition (`.maps` section) laid out as its `btf_map_def!`
/// makes the others (task storage needs BTF for its key and value types,
/// `BPF_F_NO_PREALLOC` and max_entries 0).
#[repr(C)]
pub(crate) struct TaskStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: the fields are placeholders the loader reads from BTF; nothing
// dereferences them (as aya-ebpf's own BTF map types).
unsafe impl<T> Sync for TaskStorage<T> {}

/// The value a thread's INFLIGHT entry starts as in a hash map (a static,
/// not a zeroed local: that would be a memset call, which the verifier
/// before 6.x does not take).
static INFLIGHT_ZERO: InFlightStack = InFlightStack {
    frames: [InFlight {
        size: 0,
        ptr_arg: 0,
        role: 0,
        depth: 0,
        record: 0,
        flags: 0,
        size_max: 0,
        entry_sp: 0,
    }; INFLIGHT_FRAMES],
    len: 0,
    _pad: 0,
};

impl TaskStorage<InFlightStack> {
    pub(crate) const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current thread's value, created zeroed when `create` and it
    /// has none; None when it has none or it could not be allocated.
    #[inline(always)]
    pub(crate) fn current(&self, create: bool) -> Option<&'static mut InFlightStack> {
        if tunable(&INFLIGHT_BY_TID) != 0 {
            return self.by_tid(create);
        }
        let flags = if create {
            u64::from(BPF_LOCAL_STORAGE_GET_F_CREATE)
        } else {
            0
        };
        // SAFETY: the helper takes this map and the current task (a
        // trusted task_struct pointer from bpf_get_current_task_btf) and
        // returns null or a pointer to the task's value, which lives as
        // long as the task; only the task's own programs use it, and
        // they do not run concurrently with each other.
        unsafe {
            let task = bpf_get_current_task_btf();
            let map = core::ptr::from_ref(self).cast_mut().cast();
            bpf_task_storage_get(map, task, core::ptr::null_mut(), flags)
                .cast::<InFlightStack>()
                .as_mut()
        }
    }

    /// `current` where the map is a hash keyed by thread id.
    #[inline(always)]
    fn by_tid(&self, create: bool) -> Option<&'static mut InFlightStack> {
        let tid = bpf_get_current_pid_tgid() as u32;
        let map: *mut core::ffi::c_void = core::ptr::from_ref(self).cast_mut().cast();
        let key = core::ptr::from_ref(&tid).cast();
        // SAFETY: the helpers take this map (a hash map whose key is a u32
        // and whose value is a T once the loader rewrote it) and pointers
        // to a key and a value on this stack; the value pointer returned
        // stays valid until the entry is deleted, which only this thread's
        // exit does.
        unsafe {
            if let Some(v) = bpf_map_lookup_elem(map, key)
                .cast::<InFlightStack>()
                .as_mut()
            {
                return Some(v);
            }
            if !create {
                return None;
            }
            let zero = core::ptr::from_ref(&INFLIGHT_ZERO).cast();
            bpf_map_update_elem(map, key, zero, BPF_NOEXIST.into());
            bpf_map_lookup_elem(map, key)
                .cast::<InFlightStack>()
                .as_mut()
        }
    }

    /// Drops the current thread's value where the map is a hash keyed by
    /// thread id (task storage goes with the task by itself).
    #[inline(always)]
    pub(crate) fn forget_current(&self) {
        if tunable(&INFLIGHT_BY_TID) == 0 {
            return;
        }
        let tid = bpf_get_current_pid_tgid() as u32;
        let map: *mut core::ffi::c_void = core::ptr::from_ref(self).cast_mut().cast();
        // SAFETY: as in `by_tid`.
        unsafe { bpf_map_delete_elem(map, core::ptr::from_ref(&tid).cast()) };
    }
}
#[map]
pub(crate) static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);
/// Index 0, bits set by user space: CONTROL_STOPPED when the trace ends
/// (from then on entry and free probes do nothing, so the report is the
/// heap as it was at that instant while the probes are being detached,
/// which takes seconds); CONTROL_SESSION when the allocating functions run
/// as uprobe session programs (through the dispatcher in uprobe_session.rs,
/// which tail-calls PROGS), where an entry program's non-zero return skips
/// the return run.
#[map]
pub(crate) static CONTROL: Array<u32> = Array::with_max_entries(1, 0);
/// `tracer_common::STATE_*` slots: the unwind-rule caches' generation
/// (written by user space) and whether any block entered LIVE unreported
/// (written here).
#[map]
pub(crate) static STATE: Array<u64> = Array::with_max_entries(STATE_SLOTS, 0);

/// Slot `i` of STATE.
#[inline(always)]
pub(crate) fn state(i: u32) -> u64 {
    STATE.get(i).copied().unwrap_or(0)
}

/// How stacks are captured: `UNWIND_FP` (kernel frame-pointer walk into
/// STACKS) or `UNWIND_DWARF` (registers + a copy of the stack, unwound in
/// user space). Read-only, set at load time.
#[unsafe(no_mangle)]
pub(crate) static UNWIND_MODE: u32 = UNWIND_FP;
/// Bytes of stack copied per sample in DWARF mode: a multiple of
/// STACK_CHUNK, at most MAX_STACK_BYTES (checked by user space).
#[unsafe(no_mangle)]
pub(crate) static STACK_BYTES: u32 = 8192;

/// Entry programs at their Role number, the return program at slot 15
/// (uprobe_session::RETURN_SLOT); filled by user space in session mode.
#[map]
pub(crate) static PROGS: ProgramArray = ProgramArray::with_max_entries(16, 0);

/// What an entry program returns for a call whose return it does not need:
/// in session mode, 1 skips the return run; otherwise the value is unused.
#[inline(always)]
pub(crate) fn no_return_needed() -> u32 {
    u32::from(control() & CONTROL_SESSION != 0)
}

/// Index 0: the traced cgroup's id, written by user space before the
/// probes are attached, and again when the cgroup at the path given is
/// removed (0: nothing is traced) and made anew (a service restart).
#[map]
pub(crate) static CGROUP: Array<u64> = Array::with_max_entries(1, 0);
/// Tgids traced (FILTER_PIDS) or excluded (FILTER_ALL, FILTER_CGROUP), kept
/// by user space.
#[map]
pub(crate) static TRACED: HashMap<u32, u8> = HashMap::with_max_entries(8192, 0);

/// Byte offset of `tgid` in the kernel's task_struct, from its BTF (Rust
/// BPF has no CO-RE relocations); 0 = unknown: forks are not looked at.
#[unsafe(no_mangle)]
pub(crate) static TASK_TGID_OFFSET: u32 = 0;
/// Byte offset of `start_boottime` (u64, ns since boot) in the kernel's
/// task_struct, from its BTF; 0 = unknown: EXEC events carry no start.
#[unsafe(no_mangle)]
pub(crate) static TASK_START_OFFSET: u32 = 0;
/// 1 when sched_process_exit passes `group_dead` (Linux 6.16+).
#[unsafe(no_mangle)]
pub(crate) static EXIT_GROUP_DEAD: u32 = 0;

/// Whether calls of process `pid` are recorded.
#[inline(always)]
pub(crate) fn traced(pid: u32) -> bool {
    match filter() {
        FILTER_PIDS => {
            // SAFETY: the value is not read.
            unsafe { TRACED.get(pid) }.is_some()
        }
        FILTER_ALL => {
            // SAFETY: as above.
            if unsafe { TRACED.get(pid) }.is_some() {
                return false;
            }
            let want = comm();
            want[0] == 0 || bpf_get_current_comm().is_ok_and(|comm| comm == want)
        }
        FILTER_CGROUP => {
            // SAFETY: as above.
            if unsafe { TRACED.get(pid) }.is_some() {
                return false;
            }
            in_traced_cgroup()
        }
        _ => true,
    }
}

/// Whether process `pid` is one the trace is of. As `traced`, except
/// under FILTER_NONE (--pid, a command), where the probes are attached for
/// that process alone and `traced` need not look: user space keeps it in
/// TRACED (see process.rs) for the checks that see other processes.
#[inline(always)]
pub(crate) fn is_target(pid: u32) -> bool {
    match filter() {
        // SAFETY: the value is not read.
        FILTER_NONE => unsafe { TRACED.get(pid) }.is_some(),
        _ => traced(pid),
    }
}

/// Whether the current task's cgroup v2 is CGROUP's or below it. The
/// helper returns 0 for a level deeper than the task's own cgroup, which
/// is never the id wanted.
#[inline(always)]
pub(crate) fn in_traced_cgroup() -> bool {
    if !cgroup_helper() {
        return false;
    }
    let want = CGROUP.get(0).copied().unwrap_or(0);
    // SAFETY: helper without preconditions (any level is accepted).
    let id = unsafe { bpf_get_current_ancestor_cgroup_id(cgroup_level() as i32) };
    want != 0 && id == want
}

/// See `tracer_common::EXP_TABLE_LEN`; filled in by the loader.
#[unsafe(no_mangle)]
pub(crate) static EXP_TABLE: [u32; EXP_TABLE_LEN] = [0; EXP_TABLE_LEN];

/// Bytes left until the next recorded allocation, per CPU (the jemalloc /
/// Go / heapprofd method, per CPU rather than per thread: an array lookup
/// instead of a hash lookup, and the Poisson process over bytes is the
/// same). Seeded by the loader with a random draw.
#[map]
pub(crate) static COUNTDOWN: PerCpuArray<i64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub(crate) fn stopped() -> bool {
    control() & CONTROL_STOPPED != 0
}

#[inline(always)]
fn control() -> u32 {
    CONTROL.get(0).copied().unwrap_or(0)
}

/// Ask the kernel not to wake the reader on each event: a wakeup costs
/// 5–10 µs (measured on a 6.18 host). User space polls every 2 ms, and is
/// woken early once WAKEUP_BYTES are pending, so a burst (DWARF samples are
/// kilobytes each) is drained before the buffer fills.
const BPF_RB_NO_WAKEUP: u64 = 1;
pub(crate) const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const WAKEUP_BYTES: u64 = 1 << 20;

#[inline(always)]
pub(crate) fn wakeup_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
pub(crate) fn count(index: u32) {
    count_by(index, 1);
}

#[inline(always)]
pub(crate) fn count_by(index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; BPF programs do not migrate CPUs mid-run and
        // uprobe programs do not nest on one CPU.
        unsafe { *slot += n };
    }
}

#[inline(always)]
pub(crate) fn event(
    kind: EventKind,
    pid: u32,
    tid: u32,
    stack_id: i32,
    addr: u64,
    size: u64,
    role: Role,
) -> Event {
    Event {
        kind: kind as u32,
        pid,
        tid,
        stack_id,
        addr,
        size,
        // SAFETY: helper without preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        role: role as u32,
        flags: 0,
    }
}
