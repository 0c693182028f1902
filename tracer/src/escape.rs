//! Escaping of strings a traced process controls (command lines, paths,
//! symbol names) before they reach a terminal or a line-based report.
//!
//! Any user on the host can start a process whose argv holds escape
//! sequences or newlines, or name a function `__asm__("f\x1b[2J")`: printed
//! raw during a system-wide trace they would clear or retitle root's
//! terminal, or forge report lines. Every byte that is not printable text
//! is therefore written as a visible escape, in the manner of Rust's
//! `escape_debug` and `ls --quoting-style=escape`:
//!
//! - `\\` for a backslash, so that every escape below is unambiguous;
//! - `\n`, `\r`, `\t` for those three;
//! - `\xNN` for the other C0 controls (ESC is `\x1b`) and DEL, and for
//!   each byte of invalid UTF-8;
//! - `\u{NN}` for C1 controls (U+0080–U+009F, which some terminals obey as
//!   CSI and OSC) and for the Unicode characters that reorder or hide text
//!   (bidirectional overrides and isolates, line and paragraph separators).
//!
//! Everything else, including non-ASCII letters, is kept as is. JSON output
//! is exact instead: every such character is a `\uNNNN` escape there (see
//! report/json.rs), which a JSON parser turns back into the same string.

use std::{borrow::Cow, fmt::Write as _, os::unix::ffi::OsStrExt as _, path::Path};

/// `s` with every character that is not printable text escaped (see the
/// module documentation). Borrows when nothing needs escaping.
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    push_escaped(&mut out, s);
    Cow::Owned(out)
}

/// Like [`text`] for bytes that may not be UTF-8: each byte of an invalid
/// sequence becomes `\xNN`.
pub fn bytes(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        push_escaped(&mut out, chunk.valid());
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// The hidden characters of `s` escaped as [`text`] escapes them, with
/// backslashes kept as they are: for a line whose values were escaped
/// already (escaping it again would double their backslashes), so that
/// nothing in it can still act on a terminal. Borrows when nothing is
/// hidden.
pub fn hidden(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push(c),
            c => push_char(&mut out, c),
        }
    }
    Cow::Owned(out)
}

/// A path as the user should see it: [`bytes`] of its raw bytes, so a file
/// name that is not UTF-8 still shows which bytes it holds.
pub fn path(p: &Path) -> String {
    bytes(p.as_os_str().as_bytes())
}

fn needs_escape(c: char) -> bool {
    c == '\\' || is_hidden(c)
}

/// A character a terminal may obey or hide rather than show: controls
/// (C0, DEL, C1) and the format characters below.
pub fn is_hidden(c: char) -> bool {
    c.is_control() || is_invisible_format(c)
}

/// Characters that change how the text around them is displayed: the
/// bidirectional embeddings, overrides and isolates ("Trojan Source",
/// CVE-2021-42574), and the line and paragraph separators.
fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        push_char(out, c);
    }
}

fn push_char(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        // Writing to a String cannot fail.
        c if c.is_ascii_control() => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_is_borrowed_unchanged() {
        let s = "redis-server *:6379 — ünïcode [u8; 8] <T>";
        assert!(matches!(text(s), Cow::Borrowed(_)));
        assert_eq!(text(s), s);
    }

    #[test]
    fn controls_become_visible_escapes() {
        assert_eq!(text("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(text("x\ny\rz\tw"), "x\\ny\\rz\\tw");
        assert_eq!(text("\0\x07\x7f"), "\\x00\\x07\\x7f");
        // C1 CSI and OSC, which some terminals obey.
        assert_eq!(text("\u{9b}2J\u{9d}"), "\\u{9b}2J\\u{9d}");
        assert_eq!(text("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(text("\u{2028}"), "\\u{2028}");
    }

    #[test]
    fn a_backslash_is_doubled_so_escapes_cannot_be_forged() {
        assert_eq!(text("\\x1b"), "\\\\x1b");
        assert_ne!(text("\\x1b"), text("\x1b"));
    }

    #[test]
    fn hidden_escapes_what_a_terminal_obeys_and_keeps_backslashes() {
        let once = text("a\x1bb\\c");
        assert_eq!(once, "a\\x1bb\\\\c");
        assert_eq!(hidden(&once), once, "escaped text passes unchanged");
        assert_eq!(hidden("x\ny\u{202e}\\"), "x\\ny\\u{202e}\\");
        assert!(matches!(hidden("plain \\ text"), Cow::Borrowed(_)));
    }

    #[test]
    fn invalid_utf8_bytes_are_escaped_one_by_one() {
        assert_eq!(bytes(b"ok\xff\xfe\x1b\xc3\xa9"), "ok\\xff\\xfe\\x1bé");
        assert_eq!(
            path(Path::new(std::ffi::OsStr::from_bytes(b"/tmp/a\nb\x80"))),
            "/tmp/a\\nb\\x80"
        );
    }

    #[test]
    fn output_never_holds_a_control_character() {
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        let escaped = text(&all);
        assert!(!escaped
            .chars()
            .any(|c| c.is_control() || is_invisible_format(c)));
    }
}
