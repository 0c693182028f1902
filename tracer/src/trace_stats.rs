//! The trace's running numbers, read without touching the model: built by
//! `collect::collector::Collector::stats`, shown by the progress line,
//! --verbose's stats line and --serve's /metrics. On the ground floor so
//! that the server reads them without importing the collector.

/// A read-only snapshot of what the collector has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceStats {
    /// Events handled since the trace started.
    pub events: u64,
    /// In-use bytes in the heap model now (sampling weights applied).
    pub live_bytes: u64,
    /// Blocks the heap model holds as live now, in every process.
    pub live_blocks: usize,
    /// Processes with per-process state in the collector now.
    pub tracked_processes: usize,
}
