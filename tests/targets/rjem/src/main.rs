//! Test target for memtrace-bpf: a Rust program whose global allocator is
//! jemalloc through tikv-jemallocator 0.7.0 (tikv-jemalloc-sys 0.7.1,
//! jemalloc 5.3.1), linked statically into this executable with prefixed
//! symbols: no libjemalloc.so, no interposed malloc.
//!
//! Protocol (as tests/targets/sites.c): prints "ready", waits for a line on
//! stdin, runs every site in the main thread and in one worker thread,
//! prints "done". Then, with the argument "exit", exits at once; otherwise
//! waits for stdin to close. Kept blocks go into the static KEEP so nothing
//! is elided; every block is written to.
//!
//! What tikv-jemallocator's GlobalAlloc calls (flags: 0 when align <= 16 and
//! align <= size, else MALLOCX_LG_ALIGN(lg align); MALLOCX_ZERO = 0x40):
//!   alloc        -> _rjem_malloc(size)          | _rjem_mallocx(size, flags)
//!   alloc_zeroed -> _rjem_calloc(1, size)       | _rjem_mallocx(size, flags | 0x40)
//!   realloc      -> _rjem_realloc(ptr, new)     | _rjem_rallocx(ptr, new, flags)
//!   dealloc      -> _rjem_sdallocx(ptr, size, flags) (always; never _rjem_free)
//! The release build (linker GC) defines, of jemalloc's API, only
//! _rjem_malloc, _rjem_calloc, _rjem_realloc, _rjem_mallocx, _rjem_rallocx,
//! _rjem_sdallocx, _rjem_mallctl and _rjem_malloc_stats_print (`nm`: T);
//! _rjem_free, posix_memalign etc. are gone. The __rust_alloc / _zeroed /
//! _realloc / _dealloc shims tail-jump through the GOT to the first six,
//! and those are exactly what this program calls (mallctl is not).
//! _rjem_rallocx is a 7-byte stub (`xor ecx,ecx; jmp do_rallocx`) and
//! _rjem_realloc also ends in a jump to the internal do_rallocx. Seen with
//! gdb, per thread: malloc(1000) x10, calloc(1, 300) x7, malloc(16) then
//! realloc(_, 64 | 256 | 4096) x5, mallocx(5000, 12) x3, mallocx(64, 6) x4,
//! mallocx(8, 4) x6 (align 16 > size 8), mallocx(2048, 0x46) x4,
//! mallocx(128, 6) then rallocx(_, 512 | 2048 | 1024, 6) x3, malloc(700)
//! x10 and sdallocx(_, 700, 0) x5, malloc(48) + sdallocx(_, 48, 0) x20000,
//! mallocx(256, 12) + sdallocx(_, 256, 12) x1000.
//!
//! The tracer reports the requested size (for a realloc the new size), so
//! the exact numbers per thread, in tests/integration/rjem.rs, follow from
//! the sizes below.

use std::{
    alloc::{alloc, alloc_zeroed, dealloc, handle_alloc_error, Layout},
    hint::black_box,
    io::{BufRead, Write},
    ptr::null_mut,
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const KEEP_SLOTS: usize = 64;
/// Blocks kept until exit, per thread.
static KEEP: [[AtomicPtr<u8>; KEEP_SLOTS]; 2] =
    [const { [const { AtomicPtr::new(null_mut()) }; KEEP_SLOTS] }; 2];
static SINK: AtomicUsize = AtomicUsize::new(0);

fn keep(t: usize, slot: usize, p: *mut u8) {
    KEEP[t][slot].store(p, Ordering::Relaxed);
}

/// Writes `n` bytes at `p`, which must be a live block of at least `n`.
fn touch(p: *mut u8, n: usize) -> *mut u8 {
    // SAFETY: callers pass a block of at least n bytes.
    unsafe { p.write_bytes(0xab, n) };
    black_box(p)
}

/// `alloc` with a layout, or abort.
fn alloc_layout(layout: Layout, zeroed: bool) -> *mut u8 {
    // SAFETY: every layout here has a non-zero size.
    let p = unsafe {
        if zeroed {
            alloc_zeroed(layout)
        } else {
            alloc(layout)
        }
    };
    if p.is_null() {
        handle_alloc_error(layout);
    }
    p
}

fn layout(size: usize, align: usize) -> Layout {
    Layout::from_size_align(size, align).expect("valid layout")
}

/// 64 bytes aligned to 64: a Box or Vec of it goes through mallocx/rallocx.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line64([u8; 64]);

/// 10 x malloc(1000), kept.
#[inline(never)]
fn site_malloc(t: usize) -> usize {
    for i in 0..10 {
        let mut v: Vec<u8> = Vec::with_capacity(1000);
        v.resize(1000, 0xab);
        keep(t, i, black_box(v.leak()).as_mut_ptr());
    }
    10
}

/// 7 x calloc(1, 300) (vec![0u8; 300]), kept.
#[inline(never)]
fn site_calloc(t: usize) -> usize {
    for i in 0..7 {
        let v = black_box(vec![0u8; 300]).leak();
        SINK.fetch_add(usize::from(v[299]), Ordering::Relaxed);
        keep(t, 10 + i, touch(v.as_mut_ptr(), 300));
    }
    7
}

/// 5 chains of a growing Vec<u8>: malloc(16), realloc to 64, 256, 4096;
/// the last one kept.
#[inline(never)]
fn site_realloc(t: usize) -> usize {
    for i in 0..5 {
        let mut v: Vec<u8> = Vec::with_capacity(16);
        for size in [16, 64, 256, 4096] {
            v.reserve_exact(size - v.len());
            v.resize(size, 0xab);
            black_box(v.as_mut_ptr());
        }
        keep(t, 17 + i, black_box(v.leak()).as_mut_ptr());
    }
    5
}

/// 3 x mallocx(5000, MALLOCX_LG_ALIGN(12)): page-aligned, kept.
#[inline(never)]
fn site_mallocx_page(t: usize) -> usize {
    for i in 0..3 {
        let p = alloc_layout(layout(5000, 4096), false);
        keep(t, 22 + i, touch(p, 5000));
    }
    3
}

/// 4 x mallocx(64, MALLOCX_LG_ALIGN(6)): Box<Line64>, kept.
#[inline(never)]
fn site_mallocx_line(t: usize) -> usize {
    for i in 0..4 {
        let b = Box::leak(black_box(Box::new(Line64([black_box(i as u8 | 1); 64]))));
        keep(t, 25 + i, touch(b.0.as_mut_ptr(), 64));
    }
    4
}

/// 6 x mallocx(8, MALLOCX_LG_ALIGN(4)): an alignment (16) above the size
/// (8) takes mallocx even though 16 is the default alignment. Kept.
#[inline(never)]
fn site_mallocx_small(t: usize) -> usize {
    for i in 0..6 {
        let p = alloc_layout(layout(8, 16), false);
        keep(t, 29 + i, touch(p, 8));
    }
    6
}

/// 4 x mallocx(2048, MALLOCX_LG_ALIGN(6) | MALLOCX_ZERO), kept.
#[inline(never)]
fn site_mallocx_zero(t: usize) -> usize {
    for i in 0..4 {
        let p = alloc_layout(layout(2048, 64), true);
        // SAFETY: p is a live, zeroed block of 2048 bytes.
        SINK.fetch_add(usize::from(unsafe { *p.add(2047) }), Ordering::Relaxed);
        keep(t, 35 + i, touch(p, 2048));
    }
    4
}

/// 3 chains of a Vec<Line64>: mallocx(128, 6), rallocx to 512 and 2048
/// (growth), then rallocx to 1024 (shrink_to 16 elements); the last kept.
#[inline(never)]
fn site_rallocx(t: usize) -> usize {
    for i in 0..3 {
        let mut v: Vec<Line64> = Vec::with_capacity(2);
        for cap in [2, 8, 32] {
            v.reserve_exact(cap - v.len());
            v.resize(cap, Line64([0xab; 64]));
            black_box(v.as_mut_ptr());
        }
        v.truncate(16);
        v.shrink_to(16);
        keep(t, 39 + i, black_box(v.leak()).as_mut_ptr().cast());
    }
    3
}

/// 10 x malloc(700); every other one freed (sdallocx(p, 700, 0)): 5 kept.
#[inline(never)]
fn site_partial(t: usize) -> usize {
    for i in 0..10 {
        let b: Box<[u8; 700]> = black_box(Box::new([black_box(i as u8 | 1); 700]));
        if i % 2 == 0 {
            drop(b);
        } else {
            keep(t, 42 + i / 2, touch(Box::leak(b).as_mut_ptr(), 700));
        }
    }
    10
}

/// 20000 x malloc(48) + sdallocx(p, 48, 0): nothing kept.
#[inline(never)]
fn site_churn(_t: usize) -> usize {
    for i in 0..20_000 {
        let mut b: Box<[u8; 48]> = black_box(Box::new([black_box(1u8); 48]));
        b[7] = i as u8;
        SINK.fetch_add(usize::from(black_box(b)[7]), Ordering::Relaxed);
    }
    20_000
}

/// 1000 x mallocx(256, 12) + sdallocx(p, 256, 12): nothing kept.
#[inline(never)]
fn site_churn_aligned(_t: usize) -> usize {
    let l = layout(256, 4096);
    for _ in 0..1000 {
        let p = touch(alloc_layout(l, false), 256);
        // SAFETY: p came from alloc with layout l.
        unsafe { dealloc(p, l) };
    }
    1000
}

#[inline(never)]
fn run_sites(t: usize) -> usize {
    let mut n = site_malloc(t) + site_calloc(t) + site_realloc(t);
    n += site_mallocx_page(t) + site_mallocx_line(t) + site_mallocx_small(t);
    n += site_mallocx_zero(t) + site_rallocx(t) + site_partial(t);
    n += site_churn(t) + site_churn_aligned(t);
    black_box(n)
}

fn say(out: &mut std::io::StdoutLock<'_>, what: &str) {
    out.write_all(what.as_bytes()).expect("write stdout");
    out.flush().expect("flush stdout");
}

fn main() {
    let exit_at_once = std::env::args().nth(1).as_deref() == Some("exit");
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut out = std::io::stdout().lock();
    let mut line = String::with_capacity(64);
    say(&mut out, "ready\n");
    if input.read_line(&mut line).expect("read stdin") == 0 {
        std::process::exit(1);
    }
    let worker = std::thread::spawn(|| run_sites(1));
    let n = run_sites(0);
    let m = worker.join().expect("worker thread");
    SINK.fetch_add(n + m, Ordering::Relaxed);
    say(&mut out, "done\n");
    if exit_at_once {
        return;
    }
    loop {
        line.clear();
        if input.read_line(&mut line).expect("read stdin") == 0 {
            break;
        }
    }
}
