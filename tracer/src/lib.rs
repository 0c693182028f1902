//! memtrace-bpf as a library: the binary (`main.rs`) is a thin front end,
//! and the parsers are reachable from fuzz targets (`fuzz/`).
//!
//! The folders follow the data: `session` drives a trace over a `tracee`,
//! `probes` attach the BPF programs, `collect` turns their events into the
//! `model` with `stacks` unwound and named, and `report` renders it.
//!
//! Unit tests: inline, `#[cfg(test)] mod tests { .. }` at the end of the
//! file, while they are under about 150 lines; past that, in `tests.rs` in
//! the module's own folder (`model/heap.rs` -> `model/heap/tests.rs`,
//! `saved/mod.rs` -> `saved/tests.rs`), declared `#[cfg(test)] mod tests;`.
//! Tests that fall into more than one file are submodules of that
//! `tests.rs` (`saved/tests/hostile.rs`).

// Only `console` writes stderr (clippy.toml also disallows `io::stderr`).
#![deny(clippy::print_stderr)]

pub mod agent;
pub mod cli;
pub mod collect;
pub mod command_line;
pub mod console;
pub mod error;
pub mod escape;
pub mod fuzzing;
pub mod hashing;
pub mod limits;
pub mod model;
pub mod otlp;
pub mod probes;
pub mod profile;
pub mod report;
pub mod saved;
pub mod serve;
pub mod session;
pub mod stacks;
pub mod trace_stats;
pub mod tracee;
pub mod usage;
