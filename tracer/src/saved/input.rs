//! Reading a saved file: bounded while it is read (and decompressed), then
//! recognised from its first bytes, so that a file of another kind gets a
//! sentence saying what it looks like rather than a parser's complaint.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    path::Path,
};

use anyhow::{bail, Context as _};

use super::limits::MAX_INPUT_BYTES;

/// What the (decompressed) bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// A JSON object: memtrace-bpf's `--format json`.
    Json,
    /// Anything binary: read as a pprof protobuf.
    Protobuf,
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// The file's bytes, decompressed if it is gzip, with a UTF-8 byte-order
/// mark removed, and what they hold.
pub fn read(path: &Path) -> anyhow::Result<(Vec<u8>, Kind)> {
    let file = File::open(path).context("cannot open it: check the path and its permissions")?;
    decode(BufReader::new(file))
}

/// `read` of what `reader` holds.
pub fn decode(mut reader: impl BufRead) -> anyhow::Result<(Vec<u8>, Kind)> {
    let gzip = reader
        .fill_buf()
        .context("cannot read it")?
        .starts_with(&GZIP_MAGIC);
    let mut bytes = match gzip {
        true => read_limited(
            flate2::bufread::MultiGzDecoder::new(reader),
            "decompresses to",
            "cannot decompress it: its gzip data is damaged or truncated",
        )?,
        false => read_limited(reader, "is", "cannot read it")?,
    };
    if bytes.starts_with(UTF8_BOM) {
        // Editors on Windows write one; JSON parsers may refuse it (RFC 8259).
        bytes.drain(..UTF8_BOM.len());
    }
    let kind = sniff(&bytes).map_err(|err| match gzip {
        true => err.context("it is gzip-compressed"),
        false => err,
    })?;
    Ok((bytes, kind))
}

/// All of `r`, refused as soon as it passes `MAX_INPUT_BYTES`.
fn read_limited(r: impl Read, verb: &str, failed: &'static str) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    r.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut out)
        .context(failed)?;
    if out.len() as u64 > MAX_INPUT_BYTES {
        bail!(
            "it {verb} more than {} MiB, the most memtrace-bpf reads as a saved profile",
            MAX_INPUT_BYTES >> 20
        );
    }
    Ok(out)
}

/// What `bytes` look like: JSON, binary (pprof), or something that is
/// not a saved profile, said in the error.
pub fn sniff(bytes: &[u8]) -> anyhow::Result<Kind> {
    const SAVE: &str = "save one with `memtrace-bpf --format json -o FILE` (or --format pprof)";
    let Some(first) = bytes.iter().position(|b| !b.is_ascii_whitespace()) else {
        match bytes.is_empty() {
            true => bail!("it is empty (0 bytes), not a saved profile: {SAVE}"),
            false => bail!("it holds only blank space, not a saved profile: {SAVE}"),
        }
    };
    let text = &bytes[first..];
    match text[0] {
        b'{' => return Ok(Kind::Json),
        b'[' => bail!(
            "it is a JSON array, not a memtrace-bpf profile (a JSON object with \"format\": \
             \"memtrace-bpf/2\"): {SAVE}"
        ),
        _ => {}
    }
    if !looks_like_text(text) {
        return Ok(Kind::Protobuf);
    }
    if text.starts_with(b"memtrace-bpf report:") {
        bail!(
            "it is a text report of memtrace-bpf, which cannot be read back: re-run the trace \
             with --format json (or --format pprof) and -o FILE"
        );
    }
    if text.starts_with(b"memtrace-bpf diff:") {
        bail!("it is the text output of `memtrace-bpf diff`, not a saved profile: {SAVE}");
    }
    if text.starts_with(b"<") {
        bail!("it is XML or SVG (a flamegraph?), which cannot be read back: {SAVE}");
    }
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    if looks_collapsed(line) {
        bail!(
            "it looks like collapsed stacks (--format collapsed), which cannot be read back \
             (one number per stack): {SAVE}"
        );
    }
    let start = String::from_utf8_lossy(&line[..line.len().min(40)]);
    bail!("it is text, not a saved profile (it starts with {start:?}): {SAVE}")
}

/// Printable UTF-8 (tabs and line breaks allowed) in the first 512 bytes;
/// a pprof protobuf has control bytes (field keys, lengths) within its
/// first few.
fn looks_like_text(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    let mut chunks = head.utf8_chunks().peekable();
    while let Some(chunk) = chunks.next() {
        let ok = !chunk
            .valid()
            .chars()
            .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'));
        // Only the last chunk may end in a character cut by the 512 bytes.
        let cut =
            chunk.invalid().is_empty() || (chunks.peek().is_none() && head.len() < bytes.len());
        if !ok || !cut {
            return false;
        }
    }
    true
}

/// `frame;frame;... NUMBER` (a signed number in a diff's).
fn looks_collapsed(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    line.trim_end()
        .rsplit_once(' ')
        .is_some_and(|(stack, n)| stack.contains(';') && n.parse::<i128>().is_ok())
}

/// The first bytes of a file, in hex, for an error about a binary file.
pub fn first_bytes(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    hex.join(" ")
}
