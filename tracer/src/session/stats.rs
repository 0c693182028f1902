//! `--verbose`: one line on stderr every STATS_INTERVAL while tracing, so
//! that a long trace shows whether its memory stays flat (the kernel's LIVE
//! map, the processes with state, the tracer's RSS) and how busy it is.
//! Only numbers: nothing a traced process controls goes into the line.

use std::time::{Duration, Instant};

use crate::collect::collector::Collector;

/// Counting the LIVE map's keys costs one syscall per entry (about 1 s for
/// a full million-entry map): at most this often.
pub const STATS_INTERVAL: Duration = Duration::from_secs(10);

/// Events handled since the last line.
pub struct Stats {
    started: Instant,
    since: Instant,
    events: u64,
}

impl Stats {
    pub fn new() -> Stats {
        let now = Instant::now();
        Stats {
            started: now,
            since: now,
            events: 0,
        }
    }

    /// `n` events were handled (what a drain returned).
    pub fn count(&mut self, n: usize) {
        self.events += n as u64;
    }

    /// Prints the line and starts the next interval.
    pub fn print(&mut self, collector: &Collector) {
        let now = Instant::now();
        let secs = now.duration_since(self.since).as_secs_f64().max(1e-3);
        let rss = match crate::usage::own().rss_kib {
            0 => "unknown".to_string(),
            kib => format!("{:.1} MiB", kib as f64 / 1024.0),
        };
        super::progress::clear();
        eprintln!(
            "memtrace-bpf: [stats] {:.0} s: LIVE map {} entries, {} processes tracked, \
             {} live blocks, RSS {rss}, {:.0} events/s",
            now.duration_since(self.started).as_secs_f64(),
            collector.live_entries().0,
            collector.tracked_processes(),
            collector.heap().live_blocks(),
            self.events as f64 / secs,
        );
        self.since = now;
        self.events = 0;
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}
