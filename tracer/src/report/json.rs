//! JSON: the whole `Profile`, for scripts and for comparing runs.
//!
//! Strings are exact (a parser gets back the very command line or symbol
//! name), yet the file is safe to print on a terminal: serde_json writes C0
//! controls as `\uNNNN`, and `TerminalSafe` does the same for C1 controls
//! and the bidirectional and separator characters it would pass raw.

use std::io::{self, Write};

use anyhow::Context;
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter};

use super::Profile;
use crate::escape;

/// Bumped when a field changes meaning or disappears; adding fields keeps it.
const FORMAT: &str = "memtrace-bpf/1";

#[derive(Serialize)]
struct Document<'a> {
    format: &'static str,
    #[serde(flatten)]
    profile: &'a Profile,
}

/// Writes the profile as pretty-printed JSON with a `"format"` version field.
pub fn write_json(p: &Profile, w: &mut impl Write) -> anyhow::Result<()> {
    let doc = Document {
        format: FORMAT,
        profile: p,
    };
    let mut ser =
        serde_json::Serializer::with_formatter(&mut *w, TerminalSafe(PrettyFormatter::new()));
    doc.serialize(&mut ser).context("writing the JSON report")?;
    writeln!(w).context("writing the JSON report")?;
    Ok(())
}

/// serde_json's pretty layout, with every character a terminal would obey
/// written as a `\uNNNN` escape inside strings.
struct TerminalSafe<'a>(PrettyFormatter<'a>);

impl Formatter for TerminalSafe<'_> {
    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some((i, c)) = rest.char_indices().find(|&(_, c)| escape::is_hidden(c)) {
            w.write_all(&rest.as_bytes()[..i])?;
            // Every hidden character is in the Basic Multilingual Plane:
            // one \uNNNN escape, no surrogate pair.
            write!(w, "\\u{:04x}", c as u32)?;
            rest = &rest[i + c.len_utf8()..];
        }
        w.write_all(rest.as_bytes())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}
