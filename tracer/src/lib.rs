//! memtrace-bpf as a library: the binary (`main.rs`) is a thin front end,
//! and the parsers are reachable from fuzz targets (`fuzz/`).
//!
//! The folders follow the data: `session` drives a trace over a `target`,
//! `probes` attach the BPF programs, `collect` turns their events into the
//! `model` with `stacks` unwound and named, and `report` renders it.

pub mod cli;
pub mod collect;
pub mod error;
pub mod escape;
pub mod fuzzing;
pub mod model;
pub mod probes;
pub mod profile;
pub mod report;
pub mod saved;
pub mod serve;
pub mod session;
pub mod stacks;
pub mod tracee;
pub mod usage;
