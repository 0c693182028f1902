//! The kernel's memory numbers of the traced processes and the traced
//! cgroup, read about once a second during the trace and once at its end:
//! the first reading, the highest and the last (a process that exits keeps
//! its last), for the report to set beside the heap (model/explain.rs).
//!
//! Bounded: at most `MAX_WATCHED` running processes are read (the process
//! whose exit ends the trace, then the first others seen allocating), and
//! the readings of the last `MAX_EXITED` exited ones are kept; about
//! 150 bytes each. Freed with the trace. The readings during the trace are
//! taken on a thread of their own (memory_watcher.rs).

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::{
    profile::{KernelMemory, MemorySample, ProcessInfo},
    tracee::{
        liveness::start_time,
        memory::{self, CgroupMemoryFiles, MemoryUse},
    },
};

/// How often the numbers are read.
pub const MEMORY_INTERVAL: Duration = Duration::from_secs(1);
/// Running processes read at each reading.
pub const MAX_WATCHED: usize = 64;
/// Exited processes whose readings are kept for the report.
pub const MAX_EXITED: usize = 256;

/// A process by pid and start time (a reused pid is another process).
type ProcessKey = (u32, Option<u64>);

/// The first, highest and last reading of one process or cgroup.
#[derive(Clone, Copy, Debug)]
struct Readings {
    start: MemorySample,
    peak: MemorySample,
    end: MemorySample,
    count: u64,
}

impl Readings {
    fn new(first: MemorySample) -> Readings {
        Readings {
            start: first,
            peak: first,
            end: first,
            count: 1,
        }
    }

    fn add(&mut self, reading: MemorySample) {
        if reading.resident_bytes > self.peak.resident_bytes {
            self.peak = reading;
        }
        self.end = reading;
        self.count += 1;
    }

    fn report(&self, source: &str) -> KernelMemory {
        KernelMemory {
            source: source.to_string(),
            start: self.start,
            peak: self.peak,
            end: self.end,
            readings: self.count,
            growth: None,
        }
    }
}

#[derive(Clone)]
pub struct MemoryWatch {
    started: Instant,
    /// The process whose exit ends the trace (--pid, -- CMD): read first.
    root: Option<u32>,
    running: HashMap<u32, (Option<u64>, Readings)>,
    exited: VecDeque<(ProcessKey, Readings)>,
    cgroup: Option<(CgroupMemoryFiles, Option<Readings>)>,
    /// Whether a process seen was not read because MAX_WATCHED were.
    full: bool,
}

impl MemoryWatch {
    /// `cgroup`: --cgroup's memory files, when there are any to read. The
    /// first reading is taken now, once the probes are attached: the heap
    /// is counted from then on (its time is the trace's start, 0 s).
    pub fn new(root: Option<u32>, cgroup: Option<CgroupMemoryFiles>) -> Self {
        let mut watch = MemoryWatch {
            started: Instant::now(),
            root,
            running: HashMap::new(),
            exited: VecDeque::new(),
            cgroup: cgroup.map(|files| (files, None)),
            full: false,
        };
        watch.read(std::iter::empty());
        watch
    }

    /// The trace started at `started` (what later readings' times count
    /// from).
    pub fn set_started(&mut self, started: Instant) {
        self.started = started;
    }

    /// Reads every watched process and the cgroup, and admits processes
    /// of `seen` (running, in the order given) while there is room.
    pub fn read(&mut self, seen: impl Iterator<Item = u32>) {
        // Before the trace started (the first reading): 0 s.
        let secs = Instant::now()
            .saturating_duration_since(self.started)
            .as_secs_f64();
        let pids: Vec<u32> = self.running.keys().copied().collect();
        for pid in pids {
            self.read_process(pid, secs);
        }
        for pid in self.root.into_iter().chain(seen) {
            if self.running.contains_key(&pid) {
                continue;
            }
            if self.running.len() >= MAX_WATCHED {
                self.full = true;
                break;
            }
            self.admit(pid, secs);
        }
        self.read_cgroup(secs);
    }

    /// Reads only what `resident` gives: the trace's one process, or its
    /// cgroup (for a history point, between the readings of every process).
    pub fn read_resident(&mut self) {
        let secs = self.started.elapsed().as_secs_f64();
        if let Some(root) = self.root {
            self.read_process(root, secs);
        }
        self.read_cgroup(secs);
    }

    fn read_cgroup(&mut self, secs: f64) {
        if let Some((files, readings)) = &mut self.cgroup {
            if let Some(now) = files.read() {
                let sample = sample(secs, now);
                match readings {
                    Some(r) => r.add(sample),
                    None => *readings = Some(Readings::new(sample)),
                }
            }
        }
    }

    fn admit(&mut self, pid: u32, secs: f64) {
        let Some(start) = start_time(pid) else {
            return;
        };
        if let Some(now) = memory::of_process(pid) {
            self.running
                .insert(pid, (Some(start), Readings::new(sample(secs, now))));
        }
    }

    /// A new reading of `pid`; one gone (or whose pid another process has
    /// now) moves to the exited with its last reading.
    fn read_process(&mut self, pid: u32, secs: f64) {
        let Some(&(start, _)) = self.running.get(&pid) else {
            return;
        };
        let now = memory::of_process(pid).filter(|_| start_time(pid) == start);
        match now {
            Some(now) => {
                if let Some((_, readings)) = self.running.get_mut(&pid) {
                    readings.add(sample(secs, now));
                }
            }
            None => {
                if let Some((start, readings)) = self.running.remove(&pid) {
                    if self.exited.len() >= MAX_EXITED {
                        self.exited.pop_front();
                    }
                    self.exited.push_back(((pid, start), readings));
                }
            }
        }
    }

    /// Each process's readings into its report entry.
    pub fn fill(&self, processes: &mut [ProcessInfo]) {
        for p in processes.iter_mut().filter(|p| p.folded == 0) {
            let running = self
                .running
                .get(&p.pid)
                .filter(|(start, _)| p.start_time.is_none() || *start == p.start_time)
                .map(|(_, r)| r);
            let readings = running.or_else(|| {
                self.exited
                    .iter()
                    .rev()
                    .find(|((pid, start), _)| *pid == p.pid && *start == p.start_time)
                    .map(|(_, r)| r)
            });
            p.memory = readings.map(|r| r.report("status"));
        }
    }

    /// The report's note when processes went unread for the bound.
    pub fn bound_note(&self) -> Option<String> {
        self.full.then(|| {
            format!(
                "the kernel's memory numbers: more than {MAX_WATCHED} processes ran at once, and \
                 only {MAX_WATCHED} are read; the others have none in the report (trace a \
                 narrower target, e.g. --pid or a smaller cgroup, to have them all)"
            )
        })
    }

    /// The cgroup's readings, for the report.
    pub fn cgroup_memory(&self) -> Option<KernelMemory> {
        let (files, readings) = self.cgroup.as_ref()?;
        let source = format!("cgroup v{}", files.version());
        readings.as_ref().map(|r| r.report(&source))
    }

    /// The resident bytes of the trace's one process or cgroup at the last
    /// reading, for the heap's history; None for other scopes.
    pub fn resident(&self) -> Option<u64> {
        if let Some((_, Some(r))) = &self.cgroup {
            return Some(r.end.resident_bytes);
        }
        let root = self.root?;
        let (_, r) = self.running.get(&root)?;
        Some(r.end.resident_bytes)
    }
}

fn sample(secs: f64, m: MemoryUse) -> MemorySample {
    MemorySample {
        secs,
        resident_bytes: m.resident,
        anon_bytes: m.anon,
        file_bytes: m.file,
        swap_bytes: m.swap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_and_its_entry_gets_its_readings() {
        let me = std::process::id();
        let mut watch = MemoryWatch::new(Some(me), None);
        watch.read(std::iter::once(me));
        assert_eq!(watch.running.len(), 1, "the root once");
        let mut entry = crate::session::facts::process_info(me, String::new(), false);
        entry.start_time = start_time(me);
        watch.fill(std::slice::from_mut(&mut entry));
        let memory = entry.memory.expect("readings");
        assert_eq!((memory.readings, memory.source.as_str()), (2, "status"));
        // Other tests of this binary allocate and free meanwhile: its
        // growth is the integration tests' to check.
        assert!(memory.end.anon_bytes > 0, "{memory:?}");
        assert_eq!(watch.resident(), Some(memory.end.resident_bytes));
        // Another process's entry with this pid gets none of them.
        entry.start_time = entry.start_time.map(|t| t + 1);
        entry.memory = None;
        watch.fill(std::slice::from_mut(&mut entry));
        assert_eq!(entry.memory, None);
    }

    #[test]
    fn a_process_gone_keeps_its_last_reading_and_the_exited_are_bounded() {
        let mut watch = MemoryWatch::new(None, None);
        let first = sample(0.0, MemoryUse::default());
        for pid in 0..(MAX_EXITED as u32 + 3) {
            // No such process: pids above pid_max.
            let pid = u32::MAX - pid;
            watch.running.insert(pid, (Some(1), Readings::new(first)));
            watch.read(std::iter::empty());
        }
        assert!(watch.running.is_empty());
        assert_eq!(watch.exited.len(), MAX_EXITED);
    }

    #[test]
    fn past_the_bound_processes_are_not_read_and_the_note_says_so() {
        let mut children: Vec<std::process::Child> = (0..=MAX_WATCHED)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .expect("sleep")
            })
            .collect();
        let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
        let mut watch = MemoryWatch::new(None, None);
        watch.read(pids[..MAX_WATCHED].iter().copied());
        assert_eq!(watch.running.len(), MAX_WATCHED);
        assert_eq!(watch.bound_note(), None, "all of them were read");
        watch.read(pids.iter().copied());
        assert_eq!(watch.running.len(), MAX_WATCHED);
        assert!(!watch.running.contains_key(&pids[MAX_WATCHED]));
        assert!(watch
            .bound_note()
            .is_some_and(|n| n.contains(&format!("only {MAX_WATCHED} are read"))));
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
