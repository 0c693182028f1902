//! Why a trace, a phase of it or one of its reports ended: one type, whose
//! words go into the report's `end_reason` and whose signal is passed on to
//! a command the trace started.

use std::fmt;

/// The signals that end a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndSignal {
    Int,
    Term,
    Hup,
}

impl EndSignal {
    pub fn name(self) -> &'static str {
        match self {
            EndSignal::Int => "SIGINT",
            EndSignal::Term => "SIGTERM",
            EndSignal::Hup => "SIGHUP",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// `-d` ran out.
    DurationElapsed,
    Signal(EndSignal),
    /// The traced process (--pid, -- CMD) exited.
    TargetExited,
    /// The wind-down: the command exited after being told to stop...
    CommandExited,
    /// ...or was killed (the words say when).
    CommandKilled(String),
    /// A report made while the trace goes on, and why.
    Snapshot(String),
}

impl EndReason {
    /// The signal a command started by the trace is sent when the trace
    /// ends this way: SIGINT and SIGHUP as they came, SIGTERM otherwise
    /// (as perf record does).
    pub fn command_signal(&self) -> EndSignal {
        match self {
            EndReason::Signal(EndSignal::Int) => EndSignal::Int,
            EndReason::Signal(EndSignal::Hup) => EndSignal::Hup,
            _ => EndSignal::Term,
        }
    }
}

/// The words of the report's `end_reason`.
impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::DurationElapsed => f.write_str("duration elapsed"),
            EndReason::Signal(EndSignal::Int) => f.write_str("interrupted (SIGINT)"),
            EndReason::Signal(EndSignal::Hup) => f.write_str("hung up (SIGHUP)"),
            EndReason::Signal(s) => write!(f, "terminated ({})", s.name()),
            EndReason::TargetExited => f.write_str("target exited"),
            EndReason::CommandExited => f.write_str("exited"),
            EndReason::CommandKilled(when) => write!(f, "was killed (SIGKILL) {when}"),
            EndReason::Snapshot(why) => f.write_str(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_reads_as_the_reports_say_and_passes_its_signal_on() {
        let cases = [
            (
                EndReason::DurationElapsed,
                "duration elapsed",
                EndSignal::Term,
            ),
            (
                EndReason::Signal(EndSignal::Int),
                "interrupted (SIGINT)",
                EndSignal::Int,
            ),
            (
                EndReason::Signal(EndSignal::Hup),
                "hung up (SIGHUP)",
                EndSignal::Hup,
            ),
            (
                EndReason::Signal(EndSignal::Term),
                "terminated (SIGTERM)",
                EndSignal::Term,
            ),
            (EndReason::TargetExited, "target exited", EndSignal::Term),
        ];
        for (reason, words, signal) in cases {
            assert_eq!(reason.to_string(), words);
            assert_eq!(reason.command_signal(), signal);
        }
        let killed = EndReason::CommandKilled("on a second SIGINT".into());
        assert_eq!(
            killed.to_string(),
            "was killed (SIGKILL) on a second SIGINT"
        );
    }
}
