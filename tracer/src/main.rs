//! memtrace-bpf: trace the heap allocations of a running process with eBPF
//! uprobes and report where its outstanding memory was allocated.

use std::process::ExitCode;

use clap::Parser as _;
use memtrace_bpf::{cli, escape, session};

fn main() -> ExitCode {
    let cli = cli::Cli::parse(); // exits with status 2 on a bad command line
    if let Err(msg) = cli.validate() {
        eprintln!("memtrace-bpf: error: {}", escape::text(&msg));
        return ExitCode::from(2);
    }
    match session::run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Errors quote paths and command lines the target chose.
            eprintln!("memtrace-bpf: error: {}", escape::text(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}
