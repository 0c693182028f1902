//! `--otlp`: the profile pushed to an OpenTelemetry collector as OTLP
//! profiles over HTTP, at each `--interval` tick and at the end of the
//! trace. `report::otlp_request` makes the message; here it is encoded,
//! queued and sent by a thread of its own (`exporter`) to where the
//! command line and the OTEL_EXPORTER_OTLP_* variables say (`endpoint`),
//! over a small HTTP/1.1 client (`http`). docs/otlp.md has the collector
//! side.
//!
//! ```no_run
//! # fn f(profile: &memtrace_bpf::report::Profile) -> anyhow::Result<()> {
//! use memtrace_bpf::otlp;
//! let dest = otlp::resolve("http://127.0.0.1:4318", |name| std::env::var(name).ok())?;
//! let push = otlp::Push::start(dest)?;
//! push.profile(profile); // queued; sent in the background
//! let note = push.finish(profile); // the last one: waits 3 s at most
//! # Ok(()) }
//! ```

mod endpoint;
mod exporter;
mod http;

use std::time::Duration;

use anyhow::Context as _;
use prost::Message as _;

pub use endpoint::{resolve, BadConfig, Destination, EnvResource, PROFILES_PATH};
pub use exporter::{Exporter, Policy, Stats, QUEUE};

use crate::{
    console,
    report::{otlp_request, Note, OtlpHost, Profile},
};

/// How long the end of the trace waits for the last pushes, at most.
pub const END_WAIT: Duration = Duration::from_secs(3);
/// Within this the end's wait is not mentioned.
const QUIET_WAIT: Duration = Duration::from_millis(500);

/// A trace's pushes: the exporter and what every request says of the host.
pub struct Push {
    exporter: Exporter,
    host: OtlpHost,
}

impl Push {
    pub fn start(dest: Destination) -> anyhow::Result<Push> {
        let host = OtlpHost {
            name: host_name(),
            service_name: dest.resource.service_name.clone(),
            attributes: dest.resource.attributes.clone(),
        };
        let exporter = Exporter::start(dest, Policy::default())
            .context("starting the OTLP exporter's thread")?;
        Ok(Push { exporter, host })
    }

    /// Queues `profile` as one export request.
    pub fn profile(&self, profile: &Profile) {
        let request = otlp_request(profile, &self.host).encode_to_vec();
        self.exporter.push(request);
    }

    pub fn stats(&self) -> Stats {
        self.exporter.stats()
    }

    /// `--verbose`'s line.
    pub fn say_stats(&self) {
        let s = self.stats();
        console::say(format_args!(
            "[otlp] {}: {} sent, {} failed sends, {} dropped, {} queued",
            self.exporter.url, s.sent, s.failed, s.dropped, s.queued
        ));
    }

    /// Sends `last`, the final profile, before what is still queued, waits
    /// `END_WAIT` at most (saying so when it takes a while), says what
    /// became of the pushes, and returns it as the report's note.
    pub fn finish(self, last: &Profile) -> Note {
        let url = self.exporter.url.clone();
        let last = otlp_request(last, &self.host).encode_to_vec();
        let s = self.exporter.finish(Some(last), END_WAIT, QUIET_WAIT, || {
            console::say(format_args!(
                "OTLP: waiting at most {} s for {url} to take the last profile",
                END_WAIT.as_secs()
            ));
        });
        let line = format!(
            "OTLP: {} sent to {url}, {}, {} dropped",
            crate::report::counted(s.sent, "profile", "profiles"),
            crate::report::counted(s.failed, "failed send", "failed sends"),
            s.dropped
        );
        match s.dropped {
            0 => console::say(&line),
            _ => console::warn(&line),
        }
        Note::OtlpPushes {
            url,
            sent: s.sent,
            failed: s.failed,
            dropped: s.dropped,
        }
    }
}

/// This machine's name (`host.name`): the kernel's, as `uname -n` says;
/// "" when unreadable. Escaped where it is written.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().chars().take(255).collect())
        .unwrap_or_default()
}

/// Resolves `--otlp`'s destination from the process's environment.
pub fn destination(flag: &str) -> anyhow::Result<Destination> {
    // The message names the flag or the variable it read; it quotes their
    // values raw, escaped once where main prints the error.
    resolve(flag, |name| std::env::var(name).ok()).map_err(anyhow::Error::new)
}
