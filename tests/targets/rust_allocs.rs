//! Test target for memtrace-bpf: a Rust program built like a release build
//! (`rustc -C opt-level=3`: no frame pointers, no debug info), whose
//! allocations go through std's global allocator (the system allocator,
//! glibc malloc). Only DWARF CFI (.eh_frame) unwinding gets through it.
//!
//! Protocol: prints "ready", waits for a line on stdin, runs the four
//! allocating functions, prints "done". Then, with the argument "exit",
//! exits at once; otherwise waits for stdin to close. Everything allocated
//! is leaked, so it is still in use at the end of the trace.
//!
//! Expected numbers are in tests/integration/unwind.rs.

use std::{
    collections::HashMap,
    hint::black_box,
    io::{BufRead, Write},
};

/// One allocation of 1000 * 8 bytes.
#[inline(never)]
fn make_vec() -> &'static mut [u64] {
    let mut v: Vec<u64> = Vec::with_capacity(1000);
    for i in 0..1000u64 {
        v.push(black_box(i * 3));
    }
    black_box(v).leak()
}

/// One allocation of 4096 bytes.
#[inline(never)]
fn make_box() -> &'static mut [u8; 4096] {
    let b: Box<[u8; 4096]> = black_box(Box::new([7u8; 4096]));
    Box::leak(b)
}

/// One allocation of 300 bytes.
#[inline(never)]
fn make_string() -> &'static mut str {
    let mut s = String::with_capacity(300);
    s.push_str(black_box("allocated by make_string in rust_allocs"));
    black_box(s).leak()
}

/// A hash table grown by inserts.
#[inline(never)]
fn fill_map() -> usize {
    let mut m = HashMap::new();
    for i in 0..100u64 {
        m.insert(black_box(i), i * i);
    }
    let len = m.len();
    std::mem::forget(black_box(m));
    len
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
    black_box(make_vec());
    black_box(make_box());
    black_box(make_string());
    black_box(fill_map());
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
