//! memtrace-bpf: trace the heap allocations of a running process with eBPF
//! uprobes and report where its outstanding memory was allocated.

use std::process::ExitCode;

use clap::Parser as _;
use memtrace_bpf::{cli, console, escape, session};

fn main() -> ExitCode {
    // `report` and `diff` work on saved files: dispatched before anything
    // privileged, and before the trace's own command line is parsed.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if memtrace_bpf::saved::is_subcommand(args.first()) {
        return memtrace_bpf::saved::main(args);
    }
    if args.first().is_some_and(|a| a == "agent") {
        return memtrace_bpf::agent::main(args);
    }
    let cli = cli::Cli::parse(); // exits with status 2 on a bad command line
    if let Err(msg) = cli.validate() {
        // console, not eprintln!: a closed stderr must not panic (status 101).
        console::error(escape::text(&msg));
        return ExitCode::from(2);
    }
    if let Some(agent) = &cli.agent {
        return match memtrace_bpf::agent::client::run(&cli, agent) {
            Ok(code) => ExitCode::from(code),
            Err(err) => {
                console::error(escape::text(&format!("{err:#}")));
                ExitCode::FAILURE
            }
        };
    }
    match session::run(&cli.trace_config()) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Errors quote paths and command lines the target chose.
            console::error(escape::text(&format!("{err:#}")));
            match err.downcast_ref::<memtrace_bpf::error::TraceError>() {
                Some(memtrace_bpf::error::TraceError::InterruptedWhileLoading {
                    signal, ..
                }) => ExitCode::from(128 + *signal as u8),
                _ => ExitCode::FAILURE,
            }
        }
    }
}
