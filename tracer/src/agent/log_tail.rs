//! The end of a tracer's stderr: why it failed, as the agent says it.

use std::{
    fs,
    io::{Read as _, Seek as _},
    path::Path,
};

/// The end of a failed tracer's stderr kept as its error.
const MAX_ERROR: u64 = 2048;

/// The last lines of a tracer's stderr (at most `MAX_ERROR` bytes),
/// escaped: they quote paths and names the traced processes chose.
pub(super) fn tail_of(path: &Path) -> String {
    let Ok(mut file) = fs::File::open(path) else {
        return "the tracer failed and left no message".into();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(std::io::SeekFrom::Start(len.saturating_sub(MAX_ERROR)));
    let mut raw = Vec::new();
    let _ = file.take(MAX_ERROR).read_to_end(&mut raw);
    match raw
        .split(|&b| b == b'\n')
        .rfind(|line| !line.trim_ascii().is_empty())
    {
        Some(last) => {
            let last = last.trim_ascii();
            let last = last.strip_prefix(b"memtrace-bpf: ").unwrap_or(last);
            crate::escape::bytes(last.strip_prefix(b"error: ").unwrap_or(last))
        }
        None => "the tracer failed and left no message".into(),
    }
}
