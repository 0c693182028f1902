//! The JSON report's layout: pretty small sections, one compact line per
//! element of the top-level lists, and terminal-safe strings.

use std::io::{self, Write};

use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

use crate::escape;

/// Pretty-printed down to the elements of the top-level lists, each of
/// which is one compact line: a file of 100 k stacks stays readable with
/// `grep` and `less`, and is not mostly indentation.
pub(super) struct Layout<'a> {
    pretty: PrettyFormatter<'a>,
    compact: CompactFormatter,
    /// Containers open around the next token.
    depth: usize,
}

/// Containers nested deeper than this are written compactly.
const PRETTY_DEPTH: usize = 2;

impl Layout<'_> {
    pub(super) fn new() -> Self {
        Layout {
            pretty: PrettyFormatter::new(),
            compact: CompactFormatter,
            depth: 0,
        }
    }

    /// True when tokens inside the innermost open container are pretty.
    fn pretty_inside(&self) -> bool {
        self.depth <= PRETTY_DEPTH
    }
}

/// Calls `$method` on the pretty or the compact formatter.
macro_rules! either {
    ($self:ident, $pretty:expr, $method:ident($($arg:expr),*)) => {
        if $pretty {
            $self.pretty.$method($($arg),*)
        } else {
            $self.compact.$method($($arg),*)
        }
    };
}

impl Formatter for Layout<'_> {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        let pretty = self.depth < PRETTY_DEPTH;
        self.depth += 1;
        either!(self, pretty, begin_array(w))
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        either!(self, self.depth < PRETTY_DEPTH, end_array(w))
    }
    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        either!(self, self.pretty_inside(), begin_array_value(w, first))
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        either!(self, self.pretty_inside(), end_array_value(w))
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        let pretty = self.depth < PRETTY_DEPTH;
        self.depth += 1;
        either!(self, pretty, begin_object(w))
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        either!(self, self.depth < PRETTY_DEPTH, end_object(w))
    }
    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        either!(self, self.pretty_inside(), begin_object_key(w, first))
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        either!(self, self.pretty_inside(), begin_object_value(w))
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        either!(self, self.pretty_inside(), end_object_value(w))
    }
}

/// `Layout`, with every character a terminal would obey written as a
/// `\uNNNN` escape inside strings.
pub(super) struct TerminalSafe<'a>(pub(super) Layout<'a>);

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
