//! memtrace-bpf as a library: the binary (`main.rs`) is a thin front end,
//! and the parsers are reachable from fuzz targets (`fuzz/`).

pub mod allocators;
pub mod cli;
pub mod collector;
pub mod error;
pub mod escape;
pub mod forks;
pub mod fuzzing;
pub mod heap;
pub mod hooks;
pub mod kernel_btf;
pub mod launch;
pub mod loader;
pub mod placement;
pub mod preflight;
pub mod profile;
pub mod reader;
pub mod report;
pub mod sampling;
pub mod scope;
pub mod session;
pub mod stats;
pub mod symbolize;
pub mod target;
pub mod unwind;
pub mod uprobe_session;
