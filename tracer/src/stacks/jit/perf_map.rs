//! `/tmp/perf-PID.map`: text lines `START SIZE name`, START and SIZE in hex
//! (with or without `0x`), written by node `--perf-basic-prof`, the JVM's
//! perf-map-agent, .NET (`DOTNET_PerfMapEnabled=1`) and CPython 3.12
//! (`-X perf`). The file only grows: what was read is not read again.

use std::{fs::File, io, os::unix::fs::FileExt as _};

/// Longer lines are cut here (the rest of the line is skipped).
pub const MAX_LINE: usize = 4096;
/// Names are cut to this many bytes (at a character boundary).
pub const MAX_NAME: usize = 512;
const CHUNK: usize = 64 << 10;

/// Reads the lines appended since the last call.
#[derive(Default)]
pub struct LineReader {
    /// Bytes of the file read so far.
    offset: u64,
    /// The start of a line whose newline has not come yet (at most MAX_LINE).
    partial: Vec<u8>,
}

impl LineReader {
    /// Reads at most `budget` new bytes (and takes them off it), calling
    /// `line` for each complete line, cut to MAX_LINE bytes.
    pub fn read_new(
        &mut self,
        file: &File,
        budget: &mut u64,
        mut line: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        let mut buf = vec![0u8; CHUNK];
        while *budget > 0 {
            let want = CHUNK.min(usize::try_from(*budget).unwrap_or(CHUNK));
            let n = match file.read_at(&mut buf[..want], self.offset) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.offset += n as u64;
            *budget = budget.saturating_sub(n as u64);
            self.feed(&buf[..n], &mut line);
        }
        Ok(())
    }

    fn feed(&mut self, mut data: &[u8], line: &mut impl FnMut(&[u8])) {
        while let Some(i) = data.iter().position(|&b| b == b'\n') {
            self.keep(&data[..i]);
            line(&self.partial);
            self.partial.clear();
            data = &data[i + 1..];
        }
        self.keep(data);
    }

    fn keep(&mut self, bytes: &[u8]) {
        let room = MAX_LINE - self.partial.len();
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// One line: (start, end, name). None for a line that is not an entry
/// (bad hex, an empty or overflowing range).
pub fn parse_line(line: &[u8]) -> Option<(u64, u64, String)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = line.splitn(3, |&b| b == b' ');
    let start = hex(fields.next()?)?;
    let size = hex(fields.next()?)?;
    let end = start.checked_add(size).filter(|&e| e > start)?;
    let name = fields.next().unwrap_or_default();
    Some((start, end, name_of(name)))
}

/// A name from hostile bytes: cut to MAX_NAME bytes, invalid UTF-8 shown
/// as U+FFFD (as names from symbol tables are). Escaping for a terminal is
/// the renderers' (`escape`), as for every other frame name.
pub fn name_of(raw: &[u8]) -> String {
    let mut name = String::from_utf8_lossy(&raw[..raw.len().min(MAX_NAME)]).into_owned();
    if name.len() > MAX_NAME {
        let mut cut = MAX_NAME;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name
}

fn hex(field: &[u8]) -> Option<u64> {
    let digits = field
        .strip_prefix(b"0x")
        .or_else(|| field.strip_prefix(b"0X"))
        .unwrap_or(field);
    if digits.is_empty() || digits.len() > 16 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}
