//! Help texts that clap would misread if written as doc comments.
//!
//! clap replaces every `{n}` in help text with a line break, in doc
//! comments and explicit `help = "..."` strings alike
//! (clap_builder `StyledStr::replace_newline_var`), so `-o heap-{n}.json`
//! cannot be written plainly. Here the `n` of each `{n}` is drawn in clap's
//! placeholder style (underlined): the escape sequence between `{` and `n`
//! keeps clap from matching `{n}`, and it is stripped when help goes to a
//! pipe, a file or a terminal without colour, which then read `{n}`.

use clap::builder::{styling::Style, StyledStr};

use crate::limits::SNAPSHOT_NUMBER;

/// `text` with each `{n}` written so that clap shows it as `{n}`.
fn literal_snapshot_number(text: &str) -> StyledStr {
    let n = Style::new().underline();
    let shown = format!("{{{}n{}}}", n.render(), n.render_reset());
    debug_assert_eq!(SNAPSHOT_NUMBER, "{n}");
    StyledStr::from(text.replace(SNAPSHOT_NUMBER, &shown))
}

/// `--snapshot-on-peak`.
pub fn snapshot_on_peak() -> StyledStr {
    literal_snapshot_number(
        "Write a numbered snapshot (a full report; -o must contain `{n}`, e.g. -o heap-{n}.json) \
         whenever the bytes in use across the trace (every traced process together) exceed \
         those at the previous snapshot by FRACTION (default 0.1, i.e. 10 %; `25%` is read as \
         0.25) and by at least 1 MiB, at most one per second and 64 per trace: a spike leaves \
         its report on disk even if the tracer is killed later",
    )
}

/// `--interval`.
pub fn interval() -> StyledStr {
    literal_snapshot_number(
        "Record the heap's history every SECS while tracing (the trace goes on): the final \
         report gives each stack's in-use bytes over time, its growth rate and trend. With -o \
         containing `{n}` (e.g. -o heap-{n}.json), each snapshot is also written as a full \
         report with its number (from 1); the final report is the last one",
    )
}
