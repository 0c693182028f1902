//! A parsed command line: checked, then its trace run here.

use std::process::ExitCode;

use super::Cli;
use crate::{console, error::TraceError, escape, session};

/// Checks what clap cannot; a refusal is said on stderr and is the exit
/// status (2).
pub fn validated(cli: &Cli) -> Result<(), ExitCode> {
    cli.validate().map_err(|msg| {
        // console, not eprintln!: a closed stderr must not panic (status 101).
        console::error(escape::text(&msg));
        ExitCode::from(2)
    })
}

/// Runs the trace in this process; a failure is said on stderr, escaped.
pub fn run_here(cli: &Cli) -> ExitCode {
    match session::run(&cli.trace_config()) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            // Errors quote paths and command lines the target chose.
            console::error(escape::text(&format!("{err:#}")));
            match err.downcast_ref::<TraceError>() {
                Some(TraceError::InterruptedWhileLoading { signal, .. }) => {
                    ExitCode::from(128 + *signal as u8)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}
