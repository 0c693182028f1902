//! A trace's command line, parsed, run to its exit status.

use std::process::ExitCode;

use super::Cli;
use crate::{console, error::TraceError, escape, session};

/// Validates the command line, then runs the trace, locally or through
/// `--agent`; a failure is said on stderr, escaped.
pub fn run(cli: &Cli) -> ExitCode {
    if let Err(msg) = cli.validate() {
        // console, not eprintln!: a closed stderr must not panic (status 101).
        console::error(escape::text(&msg));
        return ExitCode::from(2);
    }
    if let Some(agent) = &cli.agent {
        return match crate::agent::client::run(cli, agent) {
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
            match err.downcast_ref::<TraceError>() {
                Some(TraceError::InterruptedWhileLoading { signal, .. }) => {
                    ExitCode::from(128 + *signal as u8)
                }
                _ => ExitCode::FAILURE,
            }
        }
    }
}
