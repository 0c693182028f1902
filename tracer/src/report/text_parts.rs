//! What the text report's sections share: amounts in words and units,
//! and a stack's frames, one per line (text.rs and text_peak.rs).

use std::{
    io::{self, Write},
    sync::Arc,
};

use crate::escape::text as esc;

use super::{
    allocator_frames::{folded_note, leading_allocator_frames},
    basename, Frame, NO_STACK, TRUNCATED,
};

/// Indentation of the frames under a stack's summary line.
pub(super) const FRAME_INDENT: &str = "      ";

/// `1.5 MiB (1572864 bytes) in 12 objects`.
pub(super) fn amount(bytes: u64, objects: u64) -> String {
    let objects = plural(objects, "object");
    match human_bytes(bytes) {
        Some(human) => format!("{human} ({}) in {objects}", plural(bytes, "byte")),
        None => format!("{} in {objects}", plural(bytes, "byte")),
    }
}

/// Binary units with one decimal; None below 1 KiB, where bytes say it best.
pub(super) fn human_bytes(bytes: u64) -> Option<String> {
    (bytes >= 1024).then(|| super::human_bytes(bytes))
}

pub(super) fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// A stack's frames, one per line, from the first outside the allocator
/// and the standard collections: the frames before it are counted on its
/// line (`allocator_frames.rs`).
pub(super) fn write_frames(
    frames: &[Arc<Frame>],
    truncated: bool,
    addresses: &[bool],
    w: &mut impl Write,
) -> io::Result<()> {
    if frames.is_empty() {
        writeln!(w, "{FRAME_INDENT}{NO_STACK}")?;
    }
    let folded = leading_allocator_frames(frames);
    for (i, frame) in frames.iter().enumerate().skip(folded) {
        let address = addresses.get(i).copied().unwrap_or(false);
        let line = frame_line(frame, address);
        match (i == folded && folded > 0).then(|| folded_note(folded)) {
            Some(note) => writeln!(w, "{FRAME_INDENT}{line} {note}")?,
            None => writeln!(w, "{FRAME_INDENT}{line}")?,
        }
    }
    if truncated {
        writeln!(w, "{FRAME_INDENT}{TRUNCATED} (stack ends early: see notes)")?;
    }
    Ok(())
}

/// `function (file:line) [module] [inlined]`; an unknown frame already
/// names its module and offset. With `address`, the module is followed by
/// the frame's offset in it (`[prog+0x1149]`).
pub(super) fn frame_line(f: &Frame, address: bool) -> String {
    let mut line = esc(&f.display_name()).into_owned();
    if !f.is_unknown() {
        match (&f.file, f.line) {
            (Some(file), Some(n)) => line.push_str(&format!(" ({}:{n})", esc(file))),
            (Some(file), None) => line.push_str(&format!(" ({})", esc(file))),
            (None, _) => {}
        }
        match (f.module.is_empty(), address) {
            (false, false) => line.push_str(&format!(" [{}]", esc(basename(&f.module)))),
            (false, true) => {
                let module = esc(basename(&f.module));
                line.push_str(&format!(" [{module}+{:#x}]", f.offset));
            }
            (true, true) => line.push_str(&format!(" [+{:#x}]", f.offset)),
            (true, false) => {}
        }
    }
    if f.inlined {
        line.push_str(" [inlined]");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(1023), None);
        assert_eq!(human_bytes(1536).as_deref(), Some("1.5 KiB"));
        assert_eq!(human_bytes(3 << 20).as_deref(), Some("3.0 MiB"));
        assert_eq!(human_bytes(u64::MAX).as_deref(), Some("16.0 EiB"));
    }
}
