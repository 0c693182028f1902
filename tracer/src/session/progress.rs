//! The progress line: while tracing, when stderr is a terminal, one line
//! rewritten in place about once a second (elapsed time, events per
//! second, live bytes, events lost so far), drawn by `console`, which
//! erases it before any other line goes to stderr; it is also erased when
//! the trace's loop ends, so that warnings and the final summary stay
//! clean. `-q` turns it off.
//!
//! Only numbers go into it, formatted here: nothing a traced process
//! controls.

use std::time::{Duration, Instant};

use crate::{console, trace_stats::TraceStats};

/// How often the line is rewritten.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// The numbers the line shows.
pub struct Reading {
    /// Events handled since the trace started.
    pub events: u64,
    /// In-use bytes in the heap model now.
    pub live_bytes: u64,
    /// Events the BPF side could not record (`Losses::lost`).
    pub lost: u64,
}

/// The progress line of one phase of the trace's loop; dropping it clears
/// the line (whatever ends the loop, an error included).
pub struct Progress {
    enabled: bool,
    /// When the trace started: the elapsed time counts from here.
    started: Instant,
    /// The previous reading, for the events per second.
    last: Option<(Instant, u64)>,
}

impl Progress {
    /// Shown only on a terminal that understands the erase sequence, and
    /// not with -q.
    pub fn new(quiet: bool, started: Instant) -> Progress {
        let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
        Progress {
            enabled: !quiet && !dumb && console::is_terminal(),
            started,
            last: None,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Rewrites the line with `now`'s numbers: the collector's, and the
    /// events lost so far.
    pub fn show(&mut self, stats: &TraceStats, lost: u64) {
        if !self.enabled {
            return;
        }
        let reading = Reading {
            events: stats.events,
            live_bytes: stats.live_bytes,
            lost,
        };
        let now = Instant::now();
        let rate = match self.last {
            Some((at, events)) => {
                let secs = now.duration_since(at).as_secs_f64().max(1e-3);
                reading.events.saturating_sub(events) as f64 / secs
            }
            None => {
                let secs = now.duration_since(self.started).as_secs_f64().max(1e-3);
                reading.events as f64 / secs
            }
        };
        self.last = Some((now, reading.events));
        // Numbers only; console escapes it all the same and cuts it to
        // the terminal's width.
        console::progress(&line(now.duration_since(self.started), rate, &reading));
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        console::clear_progress();
    }
}

impl super::Trace<'_> {
    /// The progress line with the numbers of now (once a second: reads the
    /// loss counters and sums the stacks' in-use bytes).
    pub(super) fn show_progress(&mut self, progress: &mut Progress) {
        let kernel = crate::probes::counters::read_losses(&self.loaded.counters);
        let lost = self.collector.losses(kernel).lost();
        progress.show(&self.collector.stats(), lost);
    }
}

/// `memtrace-bpf: 1:05 elapsed, 1234 events/s, 12.3 MiB live, 0 lost`.
fn line(elapsed: Duration, rate: f64, reading: &Reading) -> String {
    let secs = elapsed.as_secs();
    let elapsed = match secs {
        0..3600 => format!("{}:{:02}", secs / 60, secs % 60),
        _ => format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60),
    };
    format!(
        "memtrace-bpf: {elapsed} elapsed, {:.0} events/s, {} live, {} lost",
        rate,
        crate::report::human_bytes(reading.live_bytes),
        reading.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_holds_only_numbers_in_fixed_words() {
        let reading = Reading {
            events: 0,
            live_bytes: 12_900_000,
            lost: 3,
        };
        assert_eq!(
            line(Duration::from_secs(65), 1234.4, &reading),
            "memtrace-bpf: 1:05 elapsed, 1234 events/s, 12.3 MiB live, 3 lost"
        );
        let reading = Reading {
            live_bytes: 100,
            ..reading
        };
        assert_eq!(
            line(Duration::from_secs(3 * 3600 + 61), 0.0, &reading),
            "memtrace-bpf: 3:01:01 elapsed, 0 events/s, 100 B live, 3 lost"
        );
        assert_eq!(crate::report::human_bytes(1024), "1.0 KiB");
        assert_eq!(crate::report::human_bytes(u64::MAX), "16.0 EiB");
    }
}
