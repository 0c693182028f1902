//! One entry point for every renderer: `render` writes a `Profile` in the
//! format asked for, and `losses_for_stderr` says what a format with no
//! room for the loss counters leaves for stderr. The trace, `report` and
//! the server all go through here.

use std::io::Write;

use super::{Profile, Sort, View};

/// The report formats a profile can be written in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Top stacks by in-use bytes (or --view's number), then the loss
    /// counters.
    #[default]
    Text,
    /// `root;...;leaf VALUE` lines for speedscope, inferno, flamegraph.pl.
    Collapsed,
    /// SVG flamegraph rendered with inferno.
    Flamegraph,
    /// The whole profile as JSON (schema in docs/formats.md).
    Json,
    /// Gzip-compressed pprof protobuf for `go tool pprof`, Pyroscope, Parca.
    Pprof,
    /// speedscope's own JSON format: a profile per view (and per process).
    Speedscope,
}

impl Format {
    /// False for the formats with no place for the loss counters (their
    /// readers know nothing of them): a trace prints them on stderr.
    pub fn has_room_for_losses(self) -> bool {
        matches!(self, Format::Text | Format::Json)
    }

    /// Its `--format` name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Collapsed => "collapsed",
            Format::Flamegraph => "flamegraph",
            Format::Json => "json",
            Format::Pprof => "pprof",
            Format::Speedscope => "speedscope",
        }
    }

    /// What its output is and a file name for it, for the formats that
    /// are no text for a terminal (None: text, collapsed and JSON are).
    pub fn file_kind(self) -> Option<(&'static str, &'static str)> {
        match self {
            Format::Flamegraph => Some(("SVG", "FILE.svg")),
            Format::Pprof => Some(("gzip-compressed protobuf", "FILE.pb.gz")),
            Format::Speedscope => Some(("a file for speedscope", "FILE.speedscope.json")),
            Format::Text | Format::Collapsed | Format::Json => None,
        }
    }
}

/// Whether a report in `format` may go where it goes: a format that is
/// no text for a terminal is refused when no `-o` is given and stdout is a
/// terminal, with what to do. The one place the trace, `report` and
/// `diff` decide it.
pub fn check_destination(
    format: Format,
    has_output: bool,
    stdout_is_terminal: bool,
) -> Result<(), String> {
    match format.file_kind() {
        Some((what, file)) if !has_output && stdout_is_terminal => Err(format!(
            "--format {} writes {what}: add -o {file} or redirect stdout",
            format.name()
        )),
        _ => Ok(()),
    }
}

/// How a profile is rendered: what the command line (or a request) asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenderOptions {
    pub format: Format,
    /// The number collapsed stacks, flamegraphs and speedscope show, the
    /// text report ranks its stacks by, and pprof's default sample type.
    pub view: View,
    /// Stacks in the text report.
    pub top: usize,
    /// Order of the stacks in the text report.
    pub sort: Sort,
}

/// Writes `p` in `options.format`.
pub fn render(p: &Profile, options: &RenderOptions, mut w: &mut dyn Write) -> anyhow::Result<()> {
    let view = options.view;
    match options.format {
        Format::Text => Ok(super::write_text_by(
            p,
            options.top,
            options.sort,
            view,
            &mut w,
        )?),
        Format::Json => super::write_json(p, &mut w),
        Format::Collapsed => Ok(super::write_collapsed(p, view, &mut w)?),
        Format::Flamegraph => super::write_flamegraph(p, view, &mut w),
        Format::Pprof => super::write_pprof(p, view, &mut w),
        Format::Speedscope => super::write_speedscope(p, view, &mut w),
    }
}

/// The loss counters as stderr shows them when `format` has no room for
/// them (collapsed, flamegraph, pprof, speedscope); `None` otherwise.
/// The caller prints them: the report does not write to the terminal.
pub fn losses_for_stderr(p: &Profile, format: Format) -> Option<String> {
    if format.has_room_for_losses() {
        return None;
    }
    let mut text = Vec::new();
    // Writing to memory cannot fail.
    let _ = super::write_losses(&p.losses, &mut text);
    Some(String::from_utf8_lossy(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_file_formats_are_refused_and_only_on_a_terminal_without_o() {
        use clap::ValueEnum;
        for &format in Format::value_variants() {
            let refused = check_destination(format, false, true);
            assert_eq!(refused.is_err(), format.file_kind().is_some(), "{format:?}");
            assert_eq!(check_destination(format, true, true), Ok(()));
            assert_eq!(check_destination(format, false, false), Ok(()));
            let name = format
                .to_possible_value()
                .expect("a value")
                .get_name()
                .to_owned();
            assert_eq!(format.name(), name);
        }
        assert_eq!(
            check_destination(Format::Pprof, false, true),
            Err(
                "--format pprof writes gzip-compressed protobuf: add -o FILE.pb.gz or redirect \
                 stdout"
                    .into()
            )
        );
    }
}
