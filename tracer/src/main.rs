//! memtrace-bpf: trace the heap allocations of a running process with eBPF
//! uprobes and report where its outstanding memory was allocated.

use std::process::ExitCode;

use clap::Parser as _;
use memtrace_bpf::{agent, cli, console, escape};

fn main() -> ExitCode {
    // `report` and `diff` work on saved files: dispatched before anything
    // privileged, and before the trace's own command line is parsed.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if memtrace_bpf::saved::is_subcommand(args.first()) {
        return memtrace_bpf::saved::main(args);
    }
    if args.first().is_some_and(|a| a == "agent") {
        return agent::main(args);
    }
    if args.first().is_some_and(|a| a == agent::standby::WORD) {
        return agent::standby::main();
    }
    let cli = cli::Cli::parse(); // exits with status 2 on a bad command line
    if let Err(code) = cli::validated(&cli) {
        return code;
    }
    let Some(address) = &cli.agent else {
        return cli::run_here(&cli);
    };
    match agent::client::run(&cli, address) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // console, not eprintln!: a closed stderr must not panic.
            console::error(escape::text(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}
