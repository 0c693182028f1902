//! JSON: the whole `Profile`, for scripts and for comparing runs.

use std::io::Write;

use anyhow::Context;
use serde::Serialize;

use super::Profile;

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
    serde_json::to_writer_pretty(&mut *w, &doc).context("writing the JSON report")?;
    writeln!(w).context("writing the JSON report")?;
    Ok(())
}
