//! The records of the EVENTS ring buffer: an `Event` whose `kind` says
//! which of `EventKind` it is, and which fields mean what.

/// What an `Event` reports (`Event::kind`). The BPF side writes
/// `kind as u32`; user space reads it back with `EventKind::try_from`,
/// and a value that is none of these is a malformed event.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// An allocation that was recorded: the address is now in the LIVE
    /// map. `pid`, `tid`, `stack_id` (the STACKS map's id, or a negative
    /// errno when capture failed), `addr` (what the allocator returned),
    /// `size` (asked for), `timestamp_ns`, `role` and `flags`
    /// (`EVENT_UNLESS_LIVE`) are set.
    Alloc = 1,
    /// A recorded allocation was freed (by free, realloc or realloc(p,
    /// 0)): `pid`, `tid`, `addr` (passed to free) and `role` are set;
    /// `stack_id`, `size` and `timestamp_ns` are 0.
    Free = 2,
    /// As `Alloc`, with the caller's registers and a copy of the user
    /// stack for unwinding in user space: a `SampleHeader` of variable
    /// length (`stack_len` stack bytes follow it).
    AllocSample = 3,
    /// A process that may be traced called exec: its old heap is gone
    /// and its new image has new mappings. `pid` is set, `tid` is the
    /// thread that called exec, and `addr` and `size` hold the new
    /// image's thread name, 16 bytes NUL-padded, in little-endian order
    /// (`exec_comm`). A `tid` other than `pid` is an exec from a thread
    /// other than the main one: the kernel gave that thread the process's
    /// pid, and the main thread's task (which probes for one process are
    /// bound to) is gone.
    Exec = 4,
    /// `--follow-forks`: a traced process forked a child, which joined
    /// the traced set in the kernel (`pid` is the child, `tid` the
    /// parent's tgid). Sent before the child runs, so it precedes the
    /// child's own events.
    Fork = 5,
    /// The last thread of a traced process exited (only `pid` is set):
    /// user space deletes its LIVE entries; under `--follow-forks` it also
    /// left the traced set.
    Exit = 6,
    /// As `Alloc`, with the return addresses the kernel walked from
    /// unwind tables: a `FramesHeader`, then `depth` addresses, then, with
    /// `FRAMES_RESUME`, `MAX_FRAMES` address slots and `stack_len` stack
    /// bytes.
    AllocFrames = 7,
    /// The OOM killer chose a traced process as its victim
    /// (`oom:mark_victim`; `pid` is its tgid, `tid` the victim task's
    /// thread id, `timestamp_ns` when). Sent before the process's `Exit`:
    /// user space keeps its heap as in use.
    OomKill = 8,
}

impl EventKind {
    /// Every kind, in the order of their values.
    pub const ALL: [EventKind; 8] = [
        EventKind::Alloc,
        EventKind::Free,
        EventKind::AllocSample,
        EventKind::Exec,
        EventKind::Fork,
        EventKind::Exit,
        EventKind::AllocFrames,
        EventKind::OomKill,
    ];

    /// One of the three kinds that record an allocation.
    pub const fn is_alloc(self) -> bool {
        matches!(
            self,
            EventKind::Alloc | EventKind::AllocSample | EventKind::AllocFrames
        )
    }
}

impl TryFrom<u32> for EventKind {
    /// The value, which is no kind.
    type Error = u32;

    fn try_from(v: u32) -> Result<EventKind, u32> {
        EventKind::ALL
            .iter()
            .copied()
            .find(|k| *k as u32 == v)
            .ok_or(v)
    }
}

/// One record in the EVENTS ring buffer. Which fields are set depends on
/// the kind: see each `EventKind`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// An `EventKind` as u32 (`Event::kind()` reads it).
    pub kind: u32,
    /// Process id (tgid) of the caller.
    pub pid: u32,
    /// Thread id of the caller.
    pub tid: u32,
    /// Id in the STACKS map, or a negative errno when capture failed
    /// (allocations only; 0 for the others).
    pub stack_id: i32,
    /// Address returned by the allocator (allocations) or passed to free
    /// (`Free`); the thread name's first 8 bytes for `Exec`.
    pub addr: u64,
    /// Requested size in bytes (allocations); the thread name's last 8
    /// bytes for `Exec`.
    pub size: u64,
    /// `bpf_ktime_get_ns()` when the event was recorded; 0 for `Free`
    /// (nothing reads it there, and the clock read is a measurable part of
    /// a free's cost in exact mode). For `Exec`: when the process started,
    /// its task's `start_boottime` (ns since boot; 0 when unknown), which
    /// /proc/PID/stat shows in clock ticks: a pid reused before user space
    /// reads /proc is told from the process that exec'ed.
    pub timestamp_ns: u64,
    /// The `Role` of the hooked function that produced the event.
    pub role: u32,
    /// `EVENT_UNLESS_LIVE` or 0.
    pub flags: u32,
}

impl Event {
    /// What the event reports, or the value of a `kind` that is none.
    pub fn kind(&self) -> Result<EventKind, u32> {
        EventKind::try_from(self.kind)
    }
}

/// `Event::flags` of an exact-mode allocation that user space skips when
/// the address is already live in that process: a call inside the one
/// that returned it, taken for a signal handler's, recorded the block
/// first (tracer-ebpf inflight.rs). When sampling, BPF looks this up in
/// LIVE itself; in exact mode LIVE holds only blocks whose ALLOC was
/// dropped.
pub const EVENT_UNLESS_LIVE: u32 = 1;

/// The thread name an `EventKind::Exec` carries in its `addr` and `size`.
pub fn exec_comm(event: &Event) -> [u8; 16] {
    let mut comm = [0u8; 16];
    comm[..8].copy_from_slice(&event.addr.to_le_bytes());
    comm[8..].copy_from_slice(&event.size.to_le_bytes());
    comm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_other_values_are_refused() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::try_from(k as u32), Ok(k));
            let ev = Event {
                kind: k as u32,
                ..Event::default()
            };
            assert_eq!(ev.kind(), Ok(k));
        }
        let values: [u32; 8] = EventKind::ALL.map(|k| k as u32);
        assert_eq!(values, [1, 2, 3, 4, 5, 6, 7, 8], "the wire values");
        assert_eq!(EventKind::try_from(0), Err(0));
        assert_eq!(EventKind::try_from(9), Err(9));
        assert_eq!(EventKind::try_from(u32::MAX), Err(u32::MAX));
    }

    #[test]
    fn the_allocation_kinds_are_the_three_that_record_a_block() {
        let allocs: [bool; 8] = EventKind::ALL.map(EventKind::is_alloc);
        assert_eq!(
            allocs,
            [true, false, true, false, false, false, true, false]
        );
    }
}
