//! Test target for memtrace-bpf: tokio tasks whose futures hold a 32 KiB
//! array across an await, so that `tokio::spawn` moves a future of more
//! than 32 KiB through its frames (stack frames larger than any stack
//! copy), and the tasks allocate known blocks while they run on the
//! runtime's worker threads.
//!
//! Protocol (as tests/targets/sites.c): prints "ready", waits for a line on
//! stdin, runs, prints "done", then waits for stdin to close. With the
//! argument "now": runs at once (no handshake) and exits, so that a tracer
//! that started it sees it allocate in its first milliseconds.
//!
//! Per run, TASKS tasks, each (in `big_task`):
//!   - site_task_keep: KEPT x malloc(3000 + task), kept until exit;
//!   - site_task_churn: CHURN x malloc(48), each freed at once;
//!   - after its await, spawns a small task from inside the worker thread
//!     that keeps one malloc(777) (site_nested_keep).
//! Every block is written to; kept blocks go into the static KEEP.

use std::{
    hint::black_box,
    io::{BufRead, Write},
    ptr::null_mut,
    sync::atomic::{AtomicPtr, Ordering},
};

const TASKS: usize = 8;
const KEPT: usize = 10;
const CHURN: usize = 1000;
const BIG: usize = 32 * 1024;

/// Blocks kept until exit: per task, KEPT + 1 (the nested task's).
static KEEP: [[AtomicPtr<u8>; KEPT + 1]; TASKS] =
    [const { [const { AtomicPtr::new(null_mut()) }; KEPT + 1] }; TASKS];

/// A block of exactly `n` bytes (one malloc(n) with Rust's System
/// allocator), every byte written.
fn block(n: usize, fill: u8) -> Box<[u8]> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, fill);
    // Capacity == length: no reallocation.
    v.into_boxed_slice()
}

#[inline(never)]
fn site_task_keep(task: usize, i: usize) {
    let b = block(3000 + task, i as u8);
    KEEP[task][i].store(Box::into_raw(b).cast::<u8>(), Ordering::Relaxed);
}

#[inline(never)]
fn site_task_churn(i: usize) -> usize {
    let b = black_box(block(48, i as u8));
    b.iter().map(|&x| x as usize).sum()
}

#[inline(never)]
fn site_nested_keep(task: usize) {
    let b = block(777, task as u8);
    KEEP[task][KEPT].store(Box::into_raw(b).cast::<u8>(), Ordering::Relaxed);
}

/// A future of more than 32 KiB: `big` lives across the await.
async fn big_task(task: usize) -> usize {
    let mut big = [0u8; BIG];
    for (i, b) in big.iter_mut().enumerate() {
        *b = (i ^ task) as u8;
    }
    black_box(&mut big);
    tokio::task::yield_now().await;
    for i in 0..KEPT {
        site_task_keep(task, i);
    }
    let mut sum = 0;
    for i in 0..CHURN {
        sum += site_task_churn(i);
    }
    // Spawned from a worker thread; awaited so it has run before "done".
    let nested = tokio::spawn(async move { site_nested_keep(task) });
    nested.await.expect("nested task");
    sum + big.iter().map(|&b| b as usize).sum::<usize>()
}

/// Reads every kept block (so that none is optimized away): the sum of
/// their first bytes.
fn kept_sum() -> usize {
    let mut sum = 0;
    for task in &KEEP {
        for slot in task {
            let p = slot.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: a kept block of at least 777 bytes, never freed.
                sum += usize::from(unsafe { p.read() });
            }
        }
    }
    sum
}

fn run() -> usize {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("tokio runtime");
    let sum = runtime.block_on(async {
        let handles: Vec<_> = (0..TASKS).map(|t| tokio::spawn(big_task(t))).collect();
        let mut sum = 0;
        for h in handles {
            sum += h.await.expect("task");
        }
        sum
    });
    // Stops the worker threads before "done": their exits are part of the
    // run, not of what follows.
    drop(runtime);
    sum
}

fn main() {
    let now = std::env::args().nth(1).as_deref() == Some("now");
    let stdin = std::io::stdin();
    let mut line = String::new();
    if !now {
        println!("ready");
        std::io::stdout().flush().expect("flush");
        stdin.lock().read_line(&mut line).expect("read go");
    }
    let sum = black_box(run()) + kept_sum();
    println!("done {}", sum % 10);
    std::io::stdout().flush().expect("flush");
    if now {
        return;
    }
    while stdin.lock().read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
        line.clear();
    }
}
