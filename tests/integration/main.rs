//! Integration tests: the real `memtrace-bpf` binary, run as root against C
//! and Rust programs compiled from tests/targets during the test.
//!
//! They need root (BPF): `cargo xtask test` checks it once before running
//! them, and none is ever skipped.

mod agent;
mod agent_triggers;
mod allocator_frames;
mod allocators;
mod big_saved;
mod buildup;
mod cgroup_by_pids;
mod cgroups;
mod debug_files;
mod debuginfod;
mod dist;
mod dl_reuse;
mod errors;
mod exact_frees;
mod exec;
mod forks;
mod forks_shell;
mod growth;
mod harness;
mod help;
mod hostile_saved;
mod jit_names;
mod kernel_memory;
mod launch;
mod lifecycle;
mod losses;
mod min_age;
mod naming;
mod nesting;
mod offline;
mod offline_errors;
mod offline_go;
mod oom;
mod otlp;
mod output_dest;
mod page;
mod peak;
mod peak_forks;
mod pprof;
mod privileges;
mod progress;
mod python_perf;
mod redis;
mod replaced_on_disk;
mod ripgrep;
mod rjem;
mod safety;
mod sampling;
mod saved_time;
mod scopes;
mod serve;
mod serve_guard;
mod sessions;
mod sites;
mod snapshots;
mod soak;
mod speedscope;
mod tables;
mod tables_tokio;
mod temporary;
mod traced_server;
mod unwind;
