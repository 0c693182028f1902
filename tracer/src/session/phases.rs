//! `--verbose`: what each step from the end of the trace to the exit took,
//! in time and memory, one line when the tracer is done (for `cargo xtask
//! bench-report` and for finding where a large report's memory goes).

use std::time::Instant;

use crate::{console, usage};

/// Steps measured so far: (name, milliseconds, RSS KiB, peak RSS KiB).
pub struct Phases {
    on: bool,
    last: Instant,
    steps: Vec<(&'static str, f64, u64, u64)>,
}

impl Phases {
    /// Starts measuring (nothing is measured or said without --verbose).
    pub fn start(on: bool) -> Phases {
        let mut p = Phases {
            on,
            last: Instant::now(),
            steps: Vec::new(),
        };
        p.mark("trace");
        p
    }

    /// The step `name` ended now.
    pub fn mark(&mut self, name: &'static str) {
        if !self.on {
            return;
        }
        let u = usage::own();
        let ms = self.last.elapsed().as_secs_f64() * 1e3;
        self.steps.push((name, ms, u.rss_kib, u.peak_rss_kib));
        self.last = Instant::now();
    }

    /// Says the steps: `name ms (RSS MiB, peak MiB)`, the trace's first.
    pub fn say(&self) {
        if !self.on {
            return;
        }
        let mib = |kib: u64| kib / 1024;
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|&(name, ms, rss, peak)| match name {
                "trace" => format!("trace: RSS {} MiB, peak {} MiB", mib(rss), mib(peak)),
                _ => format!(
                    "{name} {ms:.0} ms (RSS {} MiB, peak {} MiB)",
                    mib(rss),
                    mib(peak)
                ),
            })
            .collect();
        console::say(format_args!("after the trace: {}", steps.join("; ")));
    }
}
