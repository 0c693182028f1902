//! The kernel's memory numbers read on a thread of their own: a round of
//! 64 processes and a cgroup's memory.stat takes milliseconds, and a /proc
//! read can wait on the process's locks, which the trace's loop, draining
//! the ring buffer, must not do.
//!
//! The thread reads every watched process every `MEMORY_INTERVAL`, and the
//! trace's one process or cgroup at each history tick's pace as well; after
//! each round it publishes a copy of its readings (at most 320 entries),
//! which the loop reads for reports and history points. At the end of the
//! trace one last round is taken and the thread ends.

use std::{
    sync::{mpsc, Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::memory_watch::{MemoryWatch, MEMORY_INTERVAL};
use crate::profile::{KernelMemory, ProcessInfo};

enum Message {
    /// The running processes to admit, first seen first.
    Pids(Vec<u32>),
    /// The last round, then the thread ends with the readings.
    Finish,
}

pub struct MemoryWatcher {
    to_thread: Option<mpsc::Sender<Message>>,
    thread: Option<JoinHandle<MemoryWatch>>,
    /// The thread's readings after its last round.
    published: Arc<Mutex<MemoryWatch>>,
}

impl MemoryWatcher {
    /// Starts the thread with `watch` (its first readings taken); the
    /// trace's one process or cgroup is read every `resident_every` (the
    /// history's tick) if that is sooner than `MEMORY_INTERVAL`.
    pub fn start(watch: MemoryWatch, resident_every: Option<Duration>) -> MemoryWatcher {
        let published = Arc::new(Mutex::new(watch.clone()));
        let (to_thread, from_loop) = mpsc::channel();
        let shared = Arc::clone(&published);
        let every = resident_every
            .unwrap_or(MEMORY_INTERVAL)
            .clamp(Duration::from_millis(100), MEMORY_INTERVAL);
        let thread = std::thread::Builder::new()
            .name("memory-watch".into())
            .spawn(move || run(watch, &from_loop, &shared, every));
        match thread {
            Ok(thread) => MemoryWatcher {
                to_thread: Some(to_thread),
                thread: Some(thread),
                published,
            },
            // No thread: the first readings stay the only ones.
            Err(_) => MemoryWatcher {
                to_thread: None,
                thread: None,
                published,
            },
        }
    }

    /// The running processes the thread may admit (see `MemoryWatch::read`).
    pub fn offer(&self, pids: Vec<u32>) {
        if let Some(tx) = &self.to_thread {
            let _ = tx.send(Message::Pids(pids));
        }
    }

    /// The trace ended: one last round, and the thread ends.
    pub fn finish(&mut self) {
        if let Some(tx) = self.to_thread.take() {
            let _ = tx.send(Message::Finish);
        }
        if let Some(last) = self.thread.take().and_then(|t| t.join().ok()) {
            *self.published() = last;
        }
    }

    fn published(&self) -> std::sync::MutexGuard<'_, MemoryWatch> {
        self.published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// See `MemoryWatch::fill`.
    pub fn fill(&self, processes: &mut [ProcessInfo]) {
        self.published().fill(processes);
    }

    /// See `MemoryWatch::bound_note`.
    pub fn bound_note(&self) -> Option<String> {
        self.published().bound_note()
    }

    /// See `MemoryWatch::cgroup_memory`.
    pub fn cgroup_memory(&self) -> Option<KernelMemory> {
        self.published().cgroup_memory()
    }

    /// See `MemoryWatch::resident`: as of the thread's last round.
    pub fn resident(&self) -> Option<u64> {
        self.published().resident()
    }
}

impl Drop for MemoryWatcher {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The thread: a round of every process each `MEMORY_INTERVAL`, of the
/// trace's one process or cgroup each `every`, until `Finish` (or the
/// loop's end).
fn run(
    mut watch: MemoryWatch,
    from_loop: &mpsc::Receiver<Message>,
    published: &Mutex<MemoryWatch>,
    every: Duration,
) -> MemoryWatch {
    let mut pids: Vec<u32> = Vec::new();
    let mut next_all = Instant::now() + MEMORY_INTERVAL;
    let mut next_resident = Instant::now() + every;
    loop {
        let due = next_all.min(next_resident);
        match from_loop.recv_timeout(due.saturating_duration_since(Instant::now())) {
            Ok(Message::Pids(new)) => {
                pids = new;
                continue;
            }
            Ok(Message::Finish) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                watch.read(pids.iter().copied());
                return watch;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if now >= next_all {
            watch.read(pids.iter().copied());
            next_all = now + MEMORY_INTERVAL;
            next_resident = now + every;
        } else if now >= next_resident {
            watch.read_resident();
            next_resident = now + every;
        }
        *published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = watch.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_reads_and_its_last_round_is_kept_at_the_end() {
        let me = std::process::id();
        let mut watcher = MemoryWatcher::start(
            MemoryWatch::new(Some(me), None),
            Some(Duration::from_millis(100)),
        );
        std::thread::sleep(Duration::from_millis(350));
        watcher.finish();
        let mut entry = crate::session::facts::process_info(me, String::new(), false);
        entry.start_time = crate::tracee::liveness::start_time(me);
        watcher.fill(std::slice::from_mut(&mut entry));
        let memory = entry.memory.expect("readings");
        // The first, about three at the tick's pace, the last.
        assert!(memory.readings >= 3, "{memory:?}");
        assert!(memory.end.secs >= 0.3, "{memory:?}");
        assert!(watcher.resident().is_some());
        watcher.finish();
    }
}
