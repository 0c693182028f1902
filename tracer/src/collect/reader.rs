//! The ring buffer's reader: a thread that only copies events out of the
//! kernel's ring buffer into user-space batches, so that nothing slow on
//! the collector's side (unwinding, symbol tables, a hash table growing by
//! a million entries, reading /proc at an exec) holds the ring buffer up
//! while BPF fills it. The collector takes the batches at its own pace.
//!
//! The queue is bounded (`MAX_QUEUED_BYTES`): past it the reader stops
//! reading, the ring buffer fills, and BPF counts what it then drops
//! (ringbuf_full), so a collector that cannot keep up costs events that
//! are counted, never unbounded memory.

use std::{
    collections::VecDeque,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;
use aya::maps::{MapData, RingBuf};

/// Most bytes of events waiting for the collector.
const MAX_QUEUED_BYTES: usize = 512 << 20;
/// How long the reader sleeps in poll() when BPF forces no wakeup (it
/// submits most events without one).
const POLL_MS: i32 = 2;
/// Events are handed over in batches of about this many bytes.
const BATCH_BYTES: usize = 1 << 20;

/// Events copied out of the ring buffer: each is a native-endian u32
/// length, then that many bytes.
#[derive(Default)]
struct Queue {
    batches: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Flush requests answered: every event submitted before the request
    /// was made is in `batches`.
    flushed: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Flush requests made.
    flush_wanted: AtomicU64,
    stop: AtomicBool,
    /// Readable when the reader queued a batch (an eventfd).
    ready: OwnedFd,
}

pub struct Reader {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Reader {
    pub fn start(events: RingBuf<MapData>) -> anyhow::Result<Reader> {
        // SAFETY: eventfd takes an initial value and flags; it returns a new
        // fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("creating an eventfd");
        }
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
            flush_wanted: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            // SAFETY: a fresh fd that we own from here on.
            ready: unsafe { OwnedFd::from_raw_fd(fd) },
        });
        // The ring buffer is read through our own mapping (ring.rs): aya's
        // goes, so that the buffer is not mapped (and counted in RSS) twice;
        // a duplicate of the map's fd keeps it open.
        // SAFETY: dup of an fd we hold; the result is checked.
        let fd = unsafe { libc::dup(events.as_raw_fd()) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .context("duplicating the ring buffer's fd");
        }
        // SAFETY: a fresh fd that we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        drop(events);
        let consumer = super::ring::map_max_entries(fd.as_raw_fd())
            .and_then(|size| super::ring::Consumer::new(fd, size))?;
        let for_thread = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ringbuf-reader".into())
            .spawn(move || read_loop(consumer, &for_thread))
            .context("starting the ring buffer's reader thread")?;
        Ok(Reader {
            shared,
            thread: Some(thread),
        })
    }

    /// Readable when events are waiting (see `take`).
    pub fn ready_fd(&self) -> RawFd {
        self.shared.ready.as_raw_fd()
    }

    /// The batches queued so far, oldest first.
    pub fn take(&self) -> Vec<Vec<u8>> {
        let mut buf = [0u8; 8];
        // SAFETY: reads the eventfd's 8-byte counter into a local buffer
        // (non-blocking: EAGAIN when nothing was signalled).
        let _ = unsafe { libc::read(self.ready_fd(), buf.as_mut_ptr().cast(), 8) };
        let mut q = lock(&self.shared.queue);
        q.bytes = 0;
        q.batches.drain(..).collect()
    }

    /// Every event submitted before this call, oldest first (the end of a
    /// trace, a command held at its exit): waits for the reader to have
    /// copied them, taking batches meanwhile so that a full queue cannot
    /// stop it.
    pub fn take_all(&self) -> Vec<Vec<u8>> {
        let want = self.shared.flush_wanted.fetch_add(1, Ordering::SeqCst) + 1;
        let mut out = Vec::new();
        loop {
            let mut q = lock(&self.shared.queue);
            q.bytes = 0;
            out.extend(q.batches.drain(..));
            if q.flushed >= want || self.thread.as_ref().is_none_or(JoinHandle::is_finished) {
                return out;
            }
            let (mut q, _) = self
                .shared
                .changed
                .wait_timeout(q, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner());
            q.bytes = 0;
            out.extend(q.batches.drain(..));
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock(m: &Mutex<Queue>) -> std::sync::MutexGuard<'_, Queue> {
    // A panic elsewhere while holding it leaves the queue itself valid.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read_loop(mut consumer: super::ring::Consumer, shared: &Shared) {
    raise_priority();
    let fd = consumer.fd();
    while !shared.stop.load(Ordering::SeqCst) {
        // Read the request before draining: whatever was submitted before
        // it was made is then in the ring buffer and gets drained below.
        let flush = shared.flush_wanted.load(Ordering::SeqCst);
        let full = lock(&shared.queue).bytes >= MAX_QUEUED_BYTES;
        if !full {
            drain(&mut consumer, shared);
        }
        {
            let mut q = lock(&shared.queue);
            if q.flushed < flush && !full {
                q.flushed = flush;
                shared.changed.notify_all();
            }
        }
        if full {
            // The collector is behind: wait for it to take batches. Polling
            // the ring buffer here would return at once (it holds data)
            // and spin a core until then.
            std::thread::sleep(Duration::from_millis(POLL_MS as u64));
        } else if shared.flush_wanted.load(Ordering::SeqCst) == flush {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; a timeout bounds the wait.
            unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        }
    }
}

/// Copies everything in the ring buffer into batches on the queue.
fn drain(consumer: &mut super::ring::Consumer, shared: &Shared) {
    let mut batch: Vec<u8> = Vec::new();
    let mut queued = false;
    let mut push = |batch: Vec<u8>| {
        let mut q = lock(&shared.queue);
        q.bytes += batch.len();
        q.batches.push_back(batch);
        queued = true;
        q.bytes
    };
    consumer.drain(|item| {
        batch.extend_from_slice(&(item.len() as u32).to_ne_bytes());
        batch.extend_from_slice(item);
        !(batch.len() >= BATCH_BYTES && push(std::mem::take(&mut batch)) >= MAX_QUEUED_BYTES)
    });
    if !batch.is_empty() {
        push(batch);
    }
    if queued {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a local to our eventfd.
        let _ = unsafe { libc::write(shared.ready.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// The events of a batch, in order.
pub fn events(batch: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = batch;
    std::iter::from_fn(move || {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_ne_bytes(*len) as usize;
        let item = tail.get(..len)?;
        rest = &tail[len..];
        Some(item)
    })
}

/// Reads a Pod value from the start of `bytes`.
pub(super) fn read_pod<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: T is Pod (any bit pattern is valid) and the length was
    // checked; read_unaligned makes no alignment assumption.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Nice value of the reader thread. It only copies the ring buffer into
/// the queue and sleeps in poll between drains, but when it does not get
/// the CPU in time the BPF programs find the ring full and drop events:
/// with 32 busy traced threads on 2 cores, at nice 0 it gets a 33rd of
/// them. At -10 the scheduler weighs it about nine times as heavy as each
/// of them (kernel/sched's nice-to-weight table: 9548 against 1024).
const READER_NICE: libc::c_int = -10;

/// Raises the calling thread's priority to READER_NICE where the tracer
/// may (root, CAP_SYS_NICE); elsewhere it stays as it is.
fn raise_priority() {
    // SAFETY: gettid and setpriority take and return plain integers;
    // PRIO_PROCESS with a thread id applies to that thread alone.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, READER_NICE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_give_back_their_events_in_order() {
        let mut batch = Vec::new();
        for item in [&b"abc"[..], b"", b"0123456789"] {
            batch.extend_from_slice(&(item.len() as u32).to_ne_bytes());
            batch.extend_from_slice(item);
        }
        let got: Vec<&[u8]> = events(&batch).collect();
        assert_eq!(got, [&b"abc"[..], b"", b"0123456789"]);
        // A truncated batch yields what is whole, then stops.
        assert_eq!(events(&batch[..batch.len() - 1]).count(), 2);
    }
}
