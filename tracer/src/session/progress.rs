//! The progress line: while tracing, when stderr is a terminal, one line
//! rewritten in place about once a second (elapsed time, events per
//! second, live bytes, events lost so far). It is cleared before any other
//! line goes to stderr (`clear`) and when the trace's loop ends, so that
//! warnings and the final summary stay clean. `-q` turns it off.
//!
//! Only numbers go into it, formatted here: nothing a traced process
//! controls.

use std::{
    io::{IsTerminal as _, Write as _},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

/// How often the line is rewritten.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Carriage return, then clear to the end of the line (ECMA-48 EL).
const ERASE_LINE: &str = "\r\x1b[K";

/// A progress line is on the terminal now (the cursor is at its end).
static SHOWN: AtomicBool = AtomicBool::new(false);

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
            enabled: !quiet && !dumb && std::io::stderr().is_terminal(),
            started,
            last: None,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Rewrites the line with `now`'s numbers.
    pub fn show(&mut self, reading: Reading) {
        if !self.enabled {
            return;
        }
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
        // Numbers only, escaped all the same should that ever change.
        let line = line(now.duration_since(self.started), rate, &reading);
        let mut line = crate::escape::text(&line).into_owned();
        let width = terminal_width().saturating_sub(1);
        if let Some(cut) = (0..=width.min(line.len()))
            .rev()
            .find(|&i| line.is_char_boundary(i))
        {
            line.truncate(cut);
        }
        let mut err = std::io::stderr().lock();
        // Written as one piece under the lock: a line another thread
        // prints goes before or after it, after `clear`.
        let _ = err.write_all(format!("{ERASE_LINE}{line}").as_bytes());
        let _ = err.flush();
        SHOWN.store(true, Ordering::Relaxed);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        clear();
    }
}

impl super::Trace<'_> {
    /// The progress line with the numbers of now (once a second: reads the
    /// loss counters and sums the stacks' in-use bytes).
    pub(super) fn show_progress(&mut self, progress: &mut Progress) {
        let lost = crate::probes::counters::read_losses(&self.loaded.counters).lost();
        progress.show(Reading {
            events: self.events,
            live_bytes: self.collector.heap().inuse_bytes(),
            lost,
        });
    }
}

/// Erases the progress line, if one is shown: call before printing any
/// other line on stderr while tracing.
pub fn clear() {
    let mut err = std::io::stderr().lock();
    if SHOWN.swap(false, Ordering::Relaxed) {
        let _ = err.write_all(ERASE_LINE.as_bytes());
        let _ = err.flush();
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

/// Columns of the terminal on stderr: a line longer than that would wrap,
/// and the carriage return would then rewrite only its last row.
fn terminal_width() -> usize {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on fd 2 writes the winsize it is given, which
    // lives for the call; on failure nothing is written.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    match (rc, size.ws_col) {
        (0, cols) if cols > 0 => usize::from(cols),
        _ => 80,
    }
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
