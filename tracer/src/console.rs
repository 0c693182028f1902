//! The one writer of stderr: every line the tracer says while it runs
//! (`say`, `warn`, `error`), the progress line (`progress`), and blocks of
//! a report's own text (`lines`). clippy's `print_stderr` is denied in the
//! rest of the crate.
//!
//! Every line starts `memtrace-bpf: `. A progress line on screen is
//! erased before anything else is written, so warnings and the final
//! summary stay clean; each write goes out whole under stderr's lock, so a
//! line another thread says goes before or after it.
//!
//! Values a traced process controls are escaped where the line is composed
//! ([`escape::text`], [`escape::path`]: they also double backslashes, so an
//! escape cannot be forged); what is written here has every character a
//! terminal would obey escaped too ([`escape::hidden`]), so nothing a
//! caller forgot reaches the terminal raw.
//!
//! ```no_run
//! use memtrace_bpf::console;
//! console::warn(format_args!("snapshot {} not written", 3));
//! // memtrace-bpf: warning: snapshot 3 not written
//! ```

use std::{
    fmt::Display,
    io::{self, IsTerminal as _, Write},
    sync::atomic::{AtomicBool, Ordering},
};

use crate::escape;

/// What every line starts with.
const PREFIX: &str = "memtrace-bpf: ";

/// Carriage return, then clear to the end of the line (ECMA-48 EL).
const ERASE_LINE: &str = "\r\x1b[K";

/// A progress line is on the terminal now (the cursor is at its end).
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

/// `memtrace-bpf: {msg}`: what the tracer is doing or did.
pub fn say(msg: impl Display) {
    write_line(&said(msg));
}

/// `memtrace-bpf: warning: {msg}`: something the user should know, and the
/// trace goes on.
pub fn warn(msg: impl Display) {
    say(format_args!("warning: {msg}"));
}

/// `memtrace-bpf: error: {msg}`: why the tracer stops.
pub fn error(msg: impl Display) {
    say(format_args!("error: {msg}"));
}

/// The line [`say`] writes for `msg`, without its newline.
pub fn said(msg: impl Display) -> String {
    let line = format!("{PREFIX}{msg}");
    escape::hidden(&line).into_owned()
}

/// Lines a report composed in full (the loss counters for a format that
/// has no place for them), written as they are but for hidden characters.
pub fn lines(text: &str) -> io::Result<()> {
    let mut err = stderr();
    write_lines(&mut err, &PROGRESS_SHOWN, text)
}

/// Stderr is a terminal (where a progress line can be drawn).
pub fn is_terminal() -> bool {
    stderr().is_terminal()
}

/// Draws `line` as the progress line, in place of the one shown: escaped,
/// and cut to the terminal's width (a line that wrapped would leave its
/// first rows behind at the next carriage return). No newline: the next
/// write here erases it.
pub fn progress(line: &str) {
    let mut err = stderr();
    let _ = write_progress(&mut err, &PROGRESS_SHOWN, line, terminal_width());
}

/// Erases the progress line, if one is shown (when the trace's loop ends).
pub fn clear_progress() {
    let mut err = stderr();
    let _ = clear(&mut err, &PROGRESS_SHOWN);
}

/// The one handle on stderr (clippy.toml disallows `std::io::stderr`
/// elsewhere). Written with `write_all`, not `eprintln!`, so that a closed
/// stderr does not panic the tracer.
#[expect(
    clippy::disallowed_methods,
    reason = "console is the one writer of stderr"
)]
fn stderr() -> io::StderrLock<'static> {
    io::stderr().lock()
}

fn write_line(line: &str) {
    let mut err = stderr();
    // Stderr closed or full: nothing else could say so either.
    let _ = clear(&mut err, &PROGRESS_SHOWN).and_then(|()| writeln!(err, "{line}"));
}

fn clear(err: &mut impl Write, shown: &AtomicBool) -> io::Result<()> {
    if shown.swap(false, Ordering::Relaxed) {
        err.write_all(ERASE_LINE.as_bytes())?;
        err.flush()?;
    }
    Ok(())
}

fn write_lines(err: &mut impl Write, shown: &AtomicBool, text: &str) -> io::Result<()> {
    clear(err, shown)?;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, newline) = match line.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (line, ""),
        };
        out.push_str(&escape::hidden(body));
        out.push_str(newline);
    }
    err.write_all(out.as_bytes())
}

fn write_progress(
    err: &mut impl Write,
    shown: &AtomicBool,
    line: &str,
    width: usize,
) -> io::Result<()> {
    let mut line = escape::text(line).into_owned();
    let width = width.saturating_sub(1);
    if let Some(cut) = (0..=width.min(line.len()))
        .rev()
        .find(|&i| line.is_char_boundary(i))
    {
        line.truncate(cut);
    }
    err.write_all(format!("{ERASE_LINE}{line}").as_bytes())?;
    err.flush()?;
    shown.store(true, Ordering::Relaxed);
    Ok(())
}

/// Columns of the terminal on stderr (80 when it says none).
fn terminal_width() -> usize {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on fd 2 writes the winsize it is given, which
    // lives for the call; on failure nothing is written.
    let rc = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) };
    match (rc, size.ws_col) {
        (0, cols) if cols > 0 => usize::from(cols),
        _ => 80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut Vec<u8>, &AtomicBool), shown: bool) -> (String, bool) {
        let (mut out, flag) = (Vec::new(), AtomicBool::new(shown));
        f(&mut out, &flag);
        (
            String::from_utf8(out).unwrap_or_default(),
            flag.into_inner(),
        )
    }

    #[test]
    fn a_line_starts_with_the_name_and_escapes_what_a_terminal_obeys() {
        assert_eq!(
            said("hooked /lib/libc.so.6"),
            "memtrace-bpf: hooked /lib/libc.so.6"
        );
        assert_eq!(
            said(format_args!("warning: {}", "a\x1b[2Jb\nc")),
            "memtrace-bpf: warning: a\\x1b[2Jb\\nc"
        );
        // Escaped already by the caller: left as it is, not escaped twice.
        let path = escape::text("/tmp/x\x1by");
        assert_eq!(said(&path), "memtrace-bpf: /tmp/x\\x1by");
    }

    #[test]
    fn the_progress_line_is_erased_before_anything_else_is_written() {
        let (out, shown) = written(|w, s| write_lines(w, s, "a\nb\n").unwrap_or(()), true);
        assert_eq!(out, "\r\x1b[Ka\nb\n");
        assert!(!shown);
        let (out, _) = written(|w, s| write_lines(w, s, "a\x07\n").unwrap_or(()), false);
        assert_eq!(out, "a\\x07\n", "nothing to erase; the bell escaped");
    }

    #[test]
    fn the_progress_line_is_escaped_cut_to_the_width_and_remembered() {
        let draw = |line: &'static str, width| {
            move |w: &mut Vec<u8>, s: &AtomicBool| write_progress(w, s, line, width).unwrap_or(())
        };
        let (out, shown) = written(draw("12 MiB\x1b", 80), false);
        assert_eq!(out, "\r\x1b[K12 MiB\\x1b");
        assert!(shown);
        // One column is left free, so the cursor never wraps.
        let (out, _) = written(draw("héllo", 3), false);
        assert_eq!(out, "\r\x1b[Kh", "cut at a character boundary");
        let (out, shown) = written(|w, s| clear(w, s).unwrap_or(()), true);
        assert_eq!((out.as_str(), shown), (ERASE_LINE, false));
    }
}
