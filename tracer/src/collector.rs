//! Drains the ring buffer, turns raw events into heap-model updates, and
//! interns call stacks (read from the stack map and normalized while the
//! process is alive).

use std::collections::HashMap;

use aya::maps::{MapData, PerCpuArray, RingBuf, StackTraceMap};
use tracer_common::{counter, Event, EVENT_ALLOC, EVENT_FREE};

use crate::{
    heap::{Heap, StackHandle},
    report::Losses,
    symbolize::{Modules, NormFrame},
};

/// An interned stack: the process it belongs to and its frames, leaf first.
pub struct Stack {
    pub pid: u32,
    /// None when the stack could not be captured.
    pub frames: Option<Vec<NormFrame>>,
}

#[derive(Default)]
pub struct StackTable {
    stacks: Vec<Stack>,
    by_id: HashMap<(u32, i32), StackHandle>,
}

impl StackTable {
    pub fn get(&self, h: StackHandle) -> Option<&Stack> {
        self.stacks.get(h as usize)
    }

    pub fn all_frames(&self) -> impl Iterator<Item = &NormFrame> {
        self.stacks
            .iter()
            .filter_map(|s| s.frames.as_ref())
            .flatten()
    }
}

pub struct Collector {
    events: RingBuf<MapData>,
    stack_map: StackTraceMap<MapData>,
    pub heap: Heap,
    pub stacks: StackTable,
    pub modules: Modules,
    /// Events that could not be decoded (should never happen).
    pub malformed_events: u64,
}

impl Collector {
    pub fn new(
        events: RingBuf<MapData>,
        stack_map: StackTraceMap<MapData>,
        modules: Modules,
    ) -> Self {
        Collector {
            events,
            stack_map,
            heap: Heap::default(),
            stacks: StackTable::default(),
            modules,
            malformed_events: 0,
        }
    }

    /// Processes every event that is in the ring buffer now. Returns how many.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        loop {
            let event = match self.events.next() {
                Some(item) => decode(&item),
                None => break,
            };
            match event {
                Some(ev) => self.handle(&ev),
                None => self.malformed_events += 1,
            }
            n += 1;
        }
        n
    }

    fn handle(&mut self, ev: &Event) {
        match ev.kind {
            EVENT_ALLOC => {
                let stack = self.intern(ev.pid, ev.stack_id);
                self.heap.alloc(ev.pid, ev.addr, ev.size, stack);
            }
            EVENT_FREE => self.heap.free(ev.pid, ev.addr),
            _ => self.malformed_events += 1,
        }
    }

    fn intern(&mut self, pid: u32, stack_id: i32) -> StackHandle {
        // Failed captures (negative ids) share one "[stack lost]" entry per
        // process so their bytes still add up.
        let key = (pid, if stack_id < 0 { -1 } else { stack_id });
        if let Some(&h) = self.stacks.by_id.get(&key) {
            return h;
        }
        let frames = if stack_id < 0 {
            None
        } else {
            self.stack_map
                .get(&(stack_id as u32), 0)
                .ok()
                .map(|st| st.frames().iter().map(|f| f.ip).collect::<Vec<_>>())
                .map(|ips| self.modules.normalize(pid, &ips))
        };
        let h = self.stacks.stacks.len() as StackHandle;
        self.stacks.stacks.push(Stack { pid, frames });
        self.stacks.by_id.insert(key, h);
        h
    }
}

fn decode(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: Event is Pod (any bit pattern is valid) and the length was
    // checked; read_unaligned makes no alignment assumption.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) })
}

/// Sums the per-CPU loss counters.
pub fn read_losses(counters: &PerCpuArray<MapData, u64>) -> Losses {
    let read = |i: u32| -> u64 {
        counters
            .get(&i, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    };
    Losses {
        ringbuf_full: read(counter::RINGBUF_FULL),
        live_map_full: read(counter::LIVE_MAP_FULL),
        stack_lost: read(counter::STACK_LOST),
        unknown_frees: read(counter::UNKNOWN_FREE),
        return_without_entry: read(counter::RETURN_WITHOUT_ENTRY),
        inflight_full: read(counter::INFLIGHT_FULL),
        read_failed: read(counter::READ_FAILED),
        stale_inflight: read(counter::STALE_INFLIGHT),
    }
}
