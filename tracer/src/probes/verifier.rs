//! A program the kernel's verifier refused, told so that a user can act:
//! which program, on which kernel, in which mode, the log's last lines
//! (the reason is at the end of a verifier log, not at its start) and the
//! whole log in a file.

use std::{fmt, io::Write as _, path::PathBuf};

/// Lines of the log's end quoted in the message.
const REASON_LINES: usize = 3;
/// Characters kept of each quoted line.
const LINE_CHARS: usize = 240;

/// A program the verifier refused.
#[derive(Debug)]
pub struct Rejected {
    pub program: String,
    pub kernel: String,
    /// The unwind mode the object was loaded for.
    pub mode: &'static str,
    /// The log's last lines that say why, joined.
    pub reason: String,
    /// Where the whole log was written, if it could be.
    pub log: Option<PathBuf>,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the verifier of kernel {} rejected BPF program {} (--unwind {}): {}",
            self.kernel, self.program, self.mode, self.reason
        )?;
        if let Some(log) = &self.log {
            write!(f, " (whole log: {})", log.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for Rejected {}

impl Rejected {
    /// The rejection in `err`, if it is one (a load error with the
    /// verifier's log); the log goes to a file of its own.
    pub fn from_error(
        err: &aya::programs::ProgramError,
        program: &str,
        kernel: &str,
        mode: &'static str,
    ) -> Option<Rejected> {
        let aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } = err
        else {
            return None;
        };
        let log = verifier_log.to_string();
        let mut reason = reason(&log);
        if reason.is_empty() {
            reason = io_error.to_string();
        }
        Some(Rejected {
            program: program.to_string(),
            kernel: kernel.to_string(),
            mode,
            reason,
            log: save(program, &log),
        })
    }
}

/// The last lines before the verifier's closing statistics: where it says
/// why it stopped.
fn reason(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_statistics(l))
        .collect();
    let start = lines.len().saturating_sub(REASON_LINES);
    lines[start..]
        .iter()
        .map(|l| l.chars().take(LINE_CHARS).collect::<String>())
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The summary lines the verifier ends every log with.
fn is_statistics(line: &str) -> bool {
    line.starts_with("processed ")
        || line.starts_with("verification time")
        || line.starts_with("stack depth")
}

/// Writes the log to a new file in the temporary directory; None (and
/// nothing written) where that fails. `create_new` refuses an existing
/// name, a symlink planted there included.
fn save(program: &str, log: &str) -> Option<PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "memtrace-bpf-verifier-{}-{program}.log",
        std::process::id()
    ));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .ok()?;
    file.write_all(log.as_bytes()).ok()?;
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_logs_end_without_its_statistics() {
        let log = "reg type unsupported for arg#0 function aligned_alloc_enter#5\n\
                   0: (bf) r6 = r1\n\
                   ; some source\n\
                   R3 min value is outside of the allowed memory range\n\
                   invalid access to map value, value_size=200 off=-20 size=4\n\
                   processed 412 insns (limit 1000000) max_states_per_insn 1 total_states 30\n\
                   verification time 120 usec\n\
                   stack depth 64\n";
        assert_eq!(
            reason(log),
            "; some source / R3 min value is outside of the allowed memory range / \
             invalid access to map value, value_size=200 off=-20 size=4"
        );
    }

    #[test]
    fn a_log_of_statistics_alone_gives_no_reason() {
        assert_eq!(reason("processed 1 insns\nverification time 3 usec\n"), "");
    }

    #[test]
    fn long_lines_are_cut() {
        let line = "x".repeat(1000);
        assert_eq!(reason(&line).len(), LINE_CHARS);
    }

    #[test]
    fn the_message_names_kernel_program_mode_and_log() {
        let r = Rejected {
            program: "alloc_return".into(),
            kernel: "7.2.0-1-amd64".into(),
            mode: "tables",
            reason: "BPF program is too large. Processed 1000001 insn".into(),
            log: Some(PathBuf::from("/tmp/x.log")),
        };
        assert_eq!(
            r.to_string(),
            "the verifier of kernel 7.2.0-1-amd64 rejected BPF program alloc_return \
             (--unwind tables): BPF program is too large. Processed 1000001 insn \
             (whole log: /tmp/x.log)"
        );
    }
}
