//! `--verbose`: one line on stderr every STATS_INTERVAL while tracing, so
//! that a long trace shows whether its memory stays flat (the kernel's LIVE
//! map, the processes with state, the tracer's RSS) and how busy it is.
//! Only numbers: nothing a traced process controls goes into the line.

use std::time::{Duration, Instant};

use crate::{stacks::kernel_tables::TablesInUse, trace_stats::TraceStats};

/// Counting the LIVE map's keys costs one syscall per entry (about 1 s for
/// a full million-entry map): at most this often.
pub const STATS_INTERVAL: Duration = Duration::from_secs(10);

/// When the trace started, and when the last line was printed with the
/// events handled by then.
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

    /// Prints the line with the collector's numbers and the LIVE map's
    /// entries now, and starts the next interval.
    pub fn print(
        &mut self,
        stats: TraceStats,
        live_map_entries: usize,
        tables: Option<TablesInUse>,
    ) {
        let now = Instant::now();
        let secs = now.duration_since(self.since).as_secs_f64().max(1e-3);
        let rss = match crate::usage::own().rss_kib {
            0 => "unknown".to_string(),
            kib => format!("{:.1} MiB", kib as f64 / 1024.0),
        };
        // Rows and trie entries: flat over a long trace once the files in
        // use have their tables (a file's rows are kept a while after its
        // last process, within the rows' fixed capacity).
        let tables = tables
            .map(|t| {
                format!(
                    ", unwind tables {} files {} rows, {} mappings of {} processes, \
                     {} kept unused {} rows",
                    t.files, t.rows, t.mappings, t.processes, t.kept_files, t.kept_rows
                )
            })
            .unwrap_or_default();
        crate::console::say(format_args!(
            "[stats] {:.0} s: LIVE map {} entries, {} processes tracked, {} live blocks{tables}, \
             RSS {rss}, {:.0} events/s",
            now.duration_since(self.started).as_secs_f64(),
            live_map_entries,
            stats.tracked_processes,
            stats.live_blocks,
            stats.events.saturating_sub(self.events) as f64 / secs,
        ));
        self.since = now;
        self.events = stats.events;
    }
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}
