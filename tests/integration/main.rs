//! Integration tests: the real `memtrace-bpf` binary, run as root against C
//! and Rust programs compiled from tests/targets during the test.
//!
//! They need root (BPF). Without root they are skipped with a loud message,
//! except where MEMTRACE_REQUIRE_ROOT_TESTS or CI is set (xtask test, CI),
//! where they fail instead.

mod allocators;
mod buildup;
mod chromium;
mod errors;
mod exec;
mod forks;
mod growth;
mod harness;
mod launch;
mod lifecycle;
mod losses;
mod min_age;
mod nesting;
mod offline;
mod page;
mod pprof;
mod privileges;
mod progress;
mod redis;
mod rjem;
mod safety;
mod sampling;
mod scopes;
mod serve;
mod sites;
mod snapshots;
mod soak;
mod speedscope;
mod unwind;
