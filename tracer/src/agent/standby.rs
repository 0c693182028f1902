//! The agent's tracer held in standby (`memtrace-bpf agent-ahead`, run by
//! the agent only): it loads the BPF programs for the agent's traces, says
//! `ready` on stdout, then reads one trace's command line on stdin (a
//! JSON array of its arguments) and runs it with the programs loaded
//! ahead. Nothing is attached before that line comes; an empty stdin ends
//! it with nothing done.

use std::{io::Write as _, process::ExitCode};

use anyhow::Context as _;
use clap::Parser as _;

use crate::{
    cli, console, escape,
    probes::{kernel_features::KernelFeatures, loader},
};

/// The first argument that runs this.
pub const WORD: &str = "agent-ahead";
/// The line of stdout that says the programs are loaded.
pub const READY: &str = "ready";
/// Bytes of the command line read at most.
pub const MAX_LINE: usize = 64 * 1024;

pub fn main() -> ExitCode {
    if let Err(err) = load() {
        console::error(escape::text(&format!("{err:#}")));
        return ExitCode::FAILURE;
    }
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{READY}").and_then(|()| out.flush()).is_err() {
        return ExitCode::FAILURE;
    }
    drop(out);
    // The agent stops reading it: later writes must not meet a closed pipe.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto stdout, whose writer (`out`) is dropped.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1) };
    }
    let args = match read_args() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(err) => {
            console::error(escape::text(&format!("{err:#}")));
            return ExitCode::from(2);
        }
    };
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            console::error(escape::text(err.to_string().trim_end()));
            return ExitCode::from(2);
        }
    };
    if let Err(code) = cli::validated(&cli) {
        return code;
    }
    if cli.agent.is_some() {
        console::error("the standby tracer runs its trace itself: --agent is not for it");
        return ExitCode::from(2);
    }
    cli::run_here(&cli)
}

/// The programs for a trace of the default sizes and unwinding.
fn load() -> anyhow::Result<()> {
    let features = KernelFeatures::probe()?;
    let defaults = cli::Cli::try_parse_from(["memtrace-bpf", "--pid", "1"])
        .context("the default command line")?;
    let limits = crate::session::limits_of(&defaults.trace_config().probes);
    loader::load_ahead(&limits, &features)
}

/// The trace's arguments, program name first; None at end of input.
/// Read a byte at a time: what follows the line on stdin is left to the
/// command the trace may start.
fn read_args() -> anyhow::Result<Option<Vec<String>>> {
    let mut line = Vec::new();
    let mut byte = 0u8;
    loop {
        if line.len() >= MAX_LINE {
            anyhow::bail!("the trace's command line is longer than {MAX_LINE} bytes");
        }
        // Not through std's Stdin, whose buffer would take what follows.
        // SAFETY: reads one byte into a byte this function owns.
        let n = unsafe { libc::read(0, std::ptr::from_mut(&mut byte).cast(), 1) };
        match n {
            0 => break,
            1 if byte == b'\n' => break,
            1 => line.push(byte),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e).context("reading the trace's command line");
                }
            }
        }
    }
    if line.trim_ascii().is_empty() {
        return Ok(None);
    }
    let args: Vec<String> =
        serde_json::from_slice(&line).context("the trace's command line is not a JSON array")?;
    Ok(Some(args))
}
