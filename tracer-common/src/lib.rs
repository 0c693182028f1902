//! Types that cross the kernel boundary between the BPF programs in
//! `tracer-ebpf` and the `memtrace-bpf` binary. Defined once, here.
//!
//! Every struct is `#[repr(C)]` with explicit padding so that it is a valid
//! `aya::Pod` (no implicit padding bytes) on both sides.
#![no_std]

/// Which allocator entry point a probe sits on. Stored in events and used as
/// the index of the user-space attach table.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Malloc = 0,
    Calloc = 1,
    Realloc = 2,
    ReallocArray = 3,
    Free = 4,
    PosixMemalign = 5,
    AlignedAlloc = 6,
    Memalign = 7,
    Valloc = 8,
    Pvalloc = 9,
    /// jemalloc's xallocx(ptr, size, extra, flags): resizes in place and
    /// returns the usable size (at least `size` when it succeeded).
    Xallocx = 10,
}

impl Role {
    pub const ALL: [Role; 11] = [
        Role::Malloc,
        Role::Calloc,
        Role::Realloc,
        Role::ReallocArray,
        Role::Free,
        Role::PosixMemalign,
        Role::AlignedAlloc,
        Role::Memalign,
        Role::Valloc,
        Role::Pvalloc,
        Role::Xallocx,
    ];

    pub fn from_u32(v: u32) -> Option<Role> {
        Role::ALL.get(v as usize).copied()
    }
}

/// The attach cookie of a uprobe session probe: the role in the low byte
/// (the dispatcher's tail-call index), and from ARG_SHIFT, 4 bits per
/// argument (rdi, rsi, rdx order), the register the argument is in at the
/// probe when instructions before it moved it; 0 = where the ABI put it.
pub mod cookie {
    pub const ROLE_MASK: u64 = 0xff;
    pub const ARG_SHIFT: u32 = 8;
    pub const RDI: u64 = 1;
    pub const RSI: u64 = 2;
    pub const RDX: u64 = 3;
    pub const RCX: u64 = 4;
    pub const R8: u64 = 5;
    pub const R9: u64 = 6;
    pub const RAX: u64 = 7;
    pub const R10: u64 = 8;
    pub const R11: u64 = 9;
}

/// `FOLLOW_FORKS` values (a read-only global set at load time): whether
/// children of traced processes join the traced set at fork.
pub const FORKS_COUNT: u32 = 0;
pub const FORKS_FOLLOW: u32 = 1;

/// Entries of the exponential table used to draw sampling intervals: entry
/// i is the mean of -ln(u) for u in [i/N, (i+1)/N), in 16.16 fixed point.
/// BPF has no floating point; an interval is `(table[rand % N] * R) >> 16`,
/// exponential with mean R (up to the table's resolution).
pub const EXP_TABLE_LEN: usize = 4096;
pub const EXP_TABLE_SHIFT: u32 = 16;

/// Bits of the CONTROL map's word: the trace has ended; the allocating
/// functions are attached as uprobe session programs.
pub const CONTROL_STOPPED: u32 = 1;
pub const CONTROL_SESSION: u32 = 2;

/// `FILTER` values: which processes the probes record. With FILTER_NONE the
/// attachment itself is per process (perf event / link pid); FILTER_PIDS
/// records only the tgids in the TRACED map (--binary); FILTER_ALL records
/// every process except the tgids in TRACED, and only threads named COMM
/// when COMM is set (system-wide); FILTER_CGROUP records every process
/// whose cgroup v2 is the one in the CGROUP map or below it (its ancestor
/// at CGROUP_LEVEL is that one), except the tgids in TRACED (--cgroup).
pub const FILTER_NONE: u32 = 0;
pub const FILTER_PIDS: u32 = 1;
pub const FILTER_ALL: u32 = 2;
pub const FILTER_CGROUP: u32 = 3;

/// `UNWIND_MODE` values (a read-only global set at load time).
pub const UNWIND_FP: u32 = 0;
pub const UNWIND_DWARF: u32 = 1;
/// Walk the stack in the kernel from unwind tables user space loaded
/// (`EventKind::AllocFrames`; docs/unwind-tables.md).
pub const UNWIND_TABLES: u32 = 2;

/// Stack bytes are copied in chunks of this size: a single read that crosses
/// the top of the stack fails as a whole, so each chunk can fail alone.
pub const STACK_CHUNK: usize = 4096;
/// Most stack bytes one sample can carry. A per-CPU map value (the copy
/// buffer) may not exceed 32 KiB.
pub const MAX_STACK_BYTES: usize = 4 * STACK_CHUNK;

/// Header of an `EventKind::AllocSample`: the event, the caller's registers at
/// the allocator's return, and how many stack bytes follow, copied from `sp`
/// upwards. Sent as `size_of::<SampleHeader>() + stack_len` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleHeader {
    pub event: Event,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack_len: u32,
    /// The process's code generation at the allocation (see `MAPS_GEN`).
    pub maps_gen: u32,
}

/// The BPF side's copy buffer: a header followed by the stack bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackSample {
    pub header: SampleHeader,
    pub stack: [u8; MAX_STACK_BYTES],
}

/// Most frames the kernel walks per stack; a deeper stack is cut and
/// flagged `FRAMES_TRUNCATED` (counted).
pub const MAX_FRAMES: usize = 512;

/// `FramesHeader::flags`: the walk reached MAX_FRAMES.
pub const FRAMES_TRUNCATED: u32 = 1;
/// The walk ended before the outermost frame (a rule it cannot follow, a
/// failed read, a bad frame pointer; counted by reason).
pub const FRAMES_ENDED: u32 = 2;
/// The walk met an address in no mapping user space described (a library
/// loaded since, or a process not described yet), or did not start because
/// the process mapped code since user space read its maps (`MAPS_GEN`,
/// depth 0): `ip`, `sp` and `bp` are
/// the registers there, and a copy of the stack from `sp` follows the
/// `MAX_FRAMES` address slots, for user space to go on with.
pub const FRAMES_RESUME: u32 = 4;

/// Header of an `EventKind::AllocFrames`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FramesHeader {
    pub event: Event,
    /// Addresses that follow: the caller's IP (just after its call into the
    /// allocator), then return addresses, innermost first.
    pub depth: u32,
    /// `FRAMES_*` bits.
    pub flags: u32,
    /// With FRAMES_RESUME: the registers where the walk stopped.
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// With FRAMES_RESUME: stack bytes copied from `sp`.
    pub stack_len: u32,
    /// The process's code generation when the walk ran (see `MAPS_GEN`).
    pub maps_gen: u32,
}

/// The BPF side's buffer for an `EventKind::AllocFrames`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FramesSample {
    pub header: FramesHeader,
    pub frames: [u64; MAX_FRAMES],
    pub stack: [u8; MAX_STACK_BYTES],
}

/// Key of the UNWIND_MAPPINGS longest-prefix-match trie: after the
/// kernel's `prefixlen`, the tgid and the address, both big-endian so that
/// the prefix covers the tgid and the high bits of the address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MappingKey {
    /// `tgid.to_be()`, `(addr >> 32).to_be()`, `(addr as u32).to_be()`.
    pub words: [u32; 3],
}

impl MappingKey {
    pub fn new(tgid: u32, addr: u64) -> MappingKey {
        MappingKey {
            words: [
                tgid.to_be(),
                ((addr >> 32) as u32).to_be(),
                (addr as u32).to_be(),
            ],
        }
    }
}

/// Bits of a MappingKey that a prefix can cover.
pub const MAPPING_KEY_BITS: u32 = 96;

/// `MappingValue::kind`: the file's rows are in UNWIND_ROWS.
pub const MAPPING_TABLE: u32 = 0;
/// No table (a file without unwind information, or whose table did not
/// fit): every frame here takes the frame-pointer chain.
pub const MAPPING_FP_ONLY: u32 = 1;

/// Value of UNWIND_MAPPINGS: how to unwind an address of one mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MappingValue {
    /// Run-time address of the table's first row address (load bias +
    /// table base): a row's address field is `pc - load_base`.
    pub load_base: u64,
    /// The table's rows: `UNWIND_ROWS[first_row .. first_row + rows]`.
    pub first_row: u32,
    pub rows: u32,
    /// `MAPPING_*`.
    pub kind: u32,
    pub _pad: u32,
}

/// Key of the LIVE map: one recorded, not yet freed allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveKey {
    pub pid: u32,
    /// `LIVE_REPORTED`, or `LIVE_UNREPORTED` for a block whose ALLOC
    /// event was dropped: free() then finds a reported block with a
    /// single delete, and looks for an unreported one only once some
    /// block went unreported (`STATE_UNREPORTED`).
    pub tag: u32,
    pub addr: u64,
}

/// `LiveKey::tag` of a block user space was told of.
pub const LIVE_REPORTED: u32 = 0;
/// `LiveKey::tag` of a block whose ALLOC event was dropped.
pub const LIVE_UNREPORTED: u32 = 1;

impl LiveKey {
    pub const fn reported(pid: u32, addr: u64) -> LiveKey {
        LiveKey {
            pid,
            tag: LIVE_REPORTED,
            addr,
        }
    }

    pub const fn unreported(pid: u32, addr: u64) -> LiveKey {
        LiveKey {
            pid,
            tag: LIVE_UNREPORTED,
            addr,
        }
    }
}

/// A process's code generation is kept by tracer-ebpf's code_gen.rs in the
/// maps `names::map::MAPS_GEN` and `MAPS_READ`.
/// Executable file mappings a `CodeMaps` remembers: the last ones, by
/// generation (the one of generation `g` is at `g % CODE_HISTORY`).
pub const CODE_HISTORY: usize = 64;

/// One executable file mapping a process made: `[start, start + len)`,
/// made when its generation became `gen` (0: the slot is empty).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeRange {
    pub start: u64,
    pub len: u32,
    pub gen: u32,
}

/// Value of MAPS_GEN: a process's code generation and its last
/// executable file mappings.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeMaps {
    pub gen: u32,
    pub _pad: u32,
    pub ranges: [CodeRange; CODE_HISTORY],
}

/// tracer-ebpf's SEEN map (exact mode's filter of frees of blocks no
/// process reported): SEEN_PAGES pages of SEEN_PAGE bytes, 8 MiB.
pub const SEEN_PAGE: usize = 4096;
pub const SEEN_PAGES: u32 = 2048;

/// Indexes of the STATE array (u64 slots shared by user space and BPF).
/// The unwind-rule caches' generation: user space bumps it after every
/// change to UNWIND_MAPPINGS, and a walker's per-CPU cache entry is used
/// only while the generation it was filled under is current. 0 = no
/// mapping yet (the caches are not used).
pub const STATE_UNWIND_GEN: u32 = 0;
/// Set to 1 by BPF the first time a block enters LIVE unreported.
pub const STATE_UNREPORTED: u32 = 1;
/// Number of STATE slots.
pub const STATE_SLOTS: u32 = 2;

/// Value of the LIVE map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveValue {
    pub size: u64,
    /// 1 when the block's ALLOC event was dropped (ring buffer full): user
    /// space never heard of it, so its free sends no FREE event and is
    /// counted as `FREE_OF_DROPPED_ALLOC` rather than as an unknown free.
    pub unreported: u32,
    pub _pad: u32,
}

/// One allocator call in flight: what its entry probe remembers for its
/// return probe. A frame of the thread's `InFlightStack`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Requested size in bytes.
    pub size: u64,
    /// realloc/reallocarray: the old pointer; posix_memalign: `memptr`.
    pub ptr_arg: u64,
    /// The `Role` of the hooked function.
    pub role: u32,
    /// Hooked allocator functions called from inside this one (glibc's
    /// realloc(NULL, n) calls malloc; reallocarray tail-calls realloc):
    /// their return probes only decrement this, so each user call counts
    /// once.
    pub depth: u32,
    /// 1 when this call is recorded. Decided at entry, so sampling can be
    /// added there without touching the return path.
    pub record: u32,
    /// `INFLIGHT_INTERRUPTED`, `INFLIGHT_INNER_RECORDED`.
    pub flags: u32,
    /// xallocx: `size + extra`, the most it asked for.
    pub size_max: u64,
    /// Stack pointer at entry (pointing at the return address); the call
    /// returns with SP = entry_sp + 8.
    pub entry_sp: u64,
}

/// `InFlight::flags`: a signal was delivered to the thread while this was
/// its innermost call in flight, so a hooked call made below it may be a
/// signal handler's rather than one made from inside this call.
pub const INFLIGHT_INTERRUPTED: u32 = 1;
/// `InFlight::flags`: a call above this one on the thread's stack of calls
/// (a signal handler's) records an allocation, so the address this call
/// returns may already be recorded (see tracer-ebpf's inflight.rs).
pub const INFLIGHT_INNER_RECORDED: u32 = 2;
/// Calls one thread can have in flight at once: its outermost allocator
/// call and signal handlers' calls that interrupted it, one inside the
/// other. Deeper ones are counted as `NESTED_LOST`.
pub const INFLIGHT_FRAMES: usize = 4;

/// Value of the INFLIGHT map, per thread: its allocator calls in flight,
/// innermost last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightStack {
    pub frames: [InFlight; INFLIGHT_FRAMES],
    /// Frames in use.
    pub len: u32,
    pub _pad: u32,
}

pub mod counter;
mod event;
pub mod names;
mod settings;
pub mod unwind_row;

pub use event::{exec_comm, Event, EventKind, EVENT_UNLESS_LIVE};
pub use settings::TraceSettings;

#[cfg(feature = "user")]
mod pod {
    use super::{
        CodeMaps, Event, FramesHeader, InFlight, LiveKey, LiveValue, MappingKey, MappingValue,
        SampleHeader,
    };
    // SAFETY: all of them are #[repr(C)], contain only integers and have no
    // implicit padding (explicit `_pad` fields fill every gap).
    unsafe impl aya::Pod for Event {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LiveValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for InFlight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for SampleHeader {}
    // SAFETY: as above.
    unsafe impl aya::Pod for FramesHeader {}
    // SAFETY: as above (three u32 words).
    unsafe impl aya::Pod for MappingKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for MappingValue {}
    // SAFETY: as above (CodeRange: u64, u32, u32).
    unsafe impl aya::Pod for CodeMaps {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn boundary_types_have_no_implicit_padding() {
        assert_eq!(size_of::<Event>(), 48);
        assert_eq!(size_of::<LiveKey>(), 16);
        assert_eq!(size_of::<LiveValue>(), 16);
        assert_eq!(size_of::<InFlight>(), 48);
        assert_eq!(size_of::<InFlightStack>(), 48 * INFLIGHT_FRAMES + 8);
        assert_eq!(size_of::<SampleHeader>(), 80);
        assert_eq!(size_of::<StackSample>(), 80 + MAX_STACK_BYTES);
        assert_eq!(size_of::<FramesHeader>(), 88);
        assert_eq!(
            size_of::<FramesSample>(),
            88 + 8 * MAX_FRAMES + MAX_STACK_BYTES
        );
        assert_eq!(size_of::<MappingKey>(), 12);
        assert_eq!(size_of::<MappingValue>(), 24);
        assert_eq!(size_of::<CodeRange>(), 16);
        assert_eq!(size_of::<CodeMaps>(), 8 + 16 * CODE_HISTORY);
    }

    #[test]
    fn roles_round_trip() {
        for r in Role::ALL {
            assert_eq!(Role::from_u32(r as u32), Some(r));
        }
        assert_eq!(Role::from_u32(99), None);
    }
}
