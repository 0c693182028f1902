//! The BPF ring buffer read directly from its mapped pages, publishing the
//! consumer position once per drain (and every 256 KiB within a long one)
//! instead of once per record.
//!
//! aya's `RingBuf` stores the consumer position after every record. The
//! kernel's reserve reads that position on every event to check for room,
//! so each store moves its cache line from the producer's CPU to the
//! reader's and back: at a million events a second that was a good part of
//! both the reader's time and the BPF programs' reserve. Here a drain
//! copies every committed record, publishing the position every 256 KiB
//! and at its end; the producers see the room a drain frees a moment
//! later, which a ring buffer of megabytes drained every few milliseconds
//! does not notice.
//!
//! The layout (kernel/bpf/ringbuf.c): page 0, the consumer position
//! (writable); page 1, the producer position; then the data pages, mapped
//! twice in a row so that a record that wraps around the end reads as one
//! slice. A record is an 8-byte header (its length with the BUSY and
//! DISCARD bits, and a page offset) and its bytes, rounded up to 8.

use std::{
    os::fd::{AsRawFd as _, OwnedFd, RawFd},
    sync::atomic::{fence, AtomicU32, AtomicUsize, Ordering},
};

use anyhow::{bail, Context as _};

const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
const HEADER_BYTES: usize = 8;

/// A consumer of one ring buffer map. Only one may exist per map: the
/// consumer position is the map's.
pub struct Consumer {
    /// The map's fd, for poll (the mappings outlive its closing).
    fd: OwnedFd,
    /// Page 0: the consumer position.
    consumer: Mapped,
    /// The producer page and the data pages twice.
    producer: Mapped,
    page: usize,
    /// Data bytes (a power of two).
    size: usize,
    /// Our position: published at the end of each drain.
    pos: usize,
}

struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mappings are plain shared memory; the reader thread is the
// only user of a Consumer.
unsafe impl Send for Consumer {}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped, once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn map(fd: RawFd, len: usize, prot: libc::c_int, offset: usize) -> anyhow::Result<Mapped> {
    // SAFETY: a new shared mapping of the map's fd; the kernel checks the
    // length and offset against the ring buffer.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error()).context("mapping the ring buffer");
    }
    Ok(Mapped { ptr, len })
}

impl Consumer {
    /// Maps the ring buffer of map `fd`, `size` data bytes (its
    /// max_entries).
    pub fn new(fd: OwnedFd, size: usize) -> anyhow::Result<Consumer> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        if !size.is_power_of_two() || size < page {
            bail!("ring buffer of {size} bytes: not a power of two of pages");
        }
        let consumer = map(fd.as_raw_fd(), page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = map(fd.as_raw_fd(), page + 2 * size, libc::PROT_READ, page)?;
        let mut c = Consumer {
            fd,
            consumer,
            producer,
            page,
            size,
            pos: 0,
        };
        c.pos = c.consumer_pos().load(Ordering::Acquire);
        Ok(c)
    }

    /// The map's fd: readable when the kernel wakes the consumer.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn consumer_pos(&self) -> &AtomicUsize {
        // SAFETY: page 0 holds the consumer position, aligned, for as long
        // as the mapping lives.
        unsafe { &*self.consumer.ptr.cast::<AtomicUsize>() }
    }

    fn producer_pos(&self) -> usize {
        // SAFETY: the producer page starts with the producer position,
        // aligned; the kernel writes it with release semantics.
        unsafe { &*self.producer.ptr.cast::<AtomicUsize>() }.load(Ordering::Acquire)
    }

    /// Bytes copied between two publications of the position within a
    /// drain: at most an eighth of the ring, so producers always find most
    /// of it free, and at most 256 KiB, well under the 1 MiB of pending
    /// data past which BPF forces a wakeup (tracer-ebpf `wakeup_flags`),
    /// while one store still serves a thousand records or more.
    fn publish_every(&self) -> usize {
        (self.size / 8).min(256 << 10)
    }

    /// Hands every committed record, oldest first, to `take` until it
    /// returns false or the next record is not committed yet, then
    /// publishes the position past what was taken. Returns the records
    /// taken.
    pub fn drain(&mut self, mut take: impl FnMut(&[u8]) -> bool) -> usize {
        let base = self.producer.ptr.cast::<u8>().cast_const();
        let mut taken = 0;
        let mut published = self.pos;
        let mut prod = self.producer_pos();
        loop {
            if self.pos == prod {
                // Caught up: look again once, in case more came meanwhile.
                prod = self.producer_pos();
                if self.pos == prod {
                    break;
                }
            }
            let offset = self.pos & (self.size - 1);
            // SAFETY: the header lies within the first copy of the data
            // pages (offset < size, 8-aligned); the kernel commits a record
            // by clearing BUSY with a fully ordered exchange, paired with
            // this acquire load.
            let header = unsafe { &*base.add(self.page + offset).cast::<AtomicU32>() }
                .load(Ordering::Acquire);
            if header & BUSY_BIT != 0 {
                break;
            }
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
            if len > self.size - HEADER_BYTES {
                // Cannot happen with a sound kernel: stop rather than read
                // beyond the mapping.
                break;
            }
            if header & DISCARD_BIT == 0 {
                // SAFETY: the data pages are mapped twice in a row, so
                // offset + 8 + len (< 2 * size) is inside the mapping; the
                // record is ours until the position is published.
                let data = unsafe {
                    std::slice::from_raw_parts(base.add(self.page + offset + HEADER_BYTES), len)
                };
                taken += 1;
                if !take(data) {
                    self.pos += (HEADER_BYTES + len).next_multiple_of(8);
                    break;
                }
            }
            self.pos += (HEADER_BYTES + len).next_multiple_of(8);
            if self.pos - published >= self.publish_every() {
                // A drain that chases busy producers can go on for long:
                // free what it copied every so often, or they find the
                // ring full while it is being emptied.
                self.consumer_pos().store(self.pos, Ordering::Release);
                published = self.pos;
            }
        }
        // Publish after the copies: the kernel reuses the space once it
        // sees the position past it.
        self.consumer_pos().store(self.pos, Ordering::Release);
        // Either a producer sees the new position, or a later drain sees
        // its record.
        fence(Ordering::SeqCst);
        taken
    }
}

/// The max_entries of BPF map `fd` (a ring buffer's data bytes).
pub fn map_max_entries(fd: RawFd) -> anyhow::Result<usize> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // struct bpf_map_info starts: type, id, key_size, value_size,
    // max_entries (u32 each).
    let mut info = [0u32; 32];
    let mut attr = [0u64; 2];
    attr[0] = fd as u64 | ((std::mem::size_of_val(&info) as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    // SAFETY: bpf(2) reads `attr` and writes at most info_len bytes of
    // `info`, both alive for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error()).context("reading the ring buffer's size");
    }
    Ok(info[4] as usize)
}
