//! Collapsed ("folded") stacks: `root;...;leaf VALUE`, one line per unique
//! stack, the input format of inferno, flamegraph.pl and speedscope.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::{Profile, StackReport, View, NO_STACK, TRUNCATED};

/// Writes one line per unique stack with a non-zero value for `view`,
/// sorted by stack so the output is deterministic and diffable.
pub fn write_collapsed(p: &Profile, view: View, w: &mut impl Write) -> io::Result<()> {
    for line in folded_lines(p, view) {
        writeln!(w, "{line}")?;
    }
    Ok(())
}

/// The collapsed lines without newlines, sorted; shared with the flamegraph,
/// which inferno draws from exactly this form.
pub(super) fn folded_lines(p: &Profile, view: View) -> Vec<String> {
    let multi = p.is_multi_process();
    // Stacks that differ only in offsets render identically: inferno would
    // draw them as one frame anyway, so merge them into one line here.
    let mut merged: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &p.stacks {
        let value = view.value(&stack.counts);
        if value == 0 {
            continue;
        }
        let sum = merged.entry(stack_string(p, stack, multi)).or_default();
        *sum = sum.saturating_add(value);
    }
    merged
        .into_iter()
        .map(|(stack, value)| format!("{stack} {value}"))
        .collect()
}

/// `root;...;leaf`, with a process root frame when several processes share
/// the profile.
fn stack_string(p: &Profile, stack: &StackReport, multi: bool) -> String {
    let mut names: Vec<String> = Vec::with_capacity(stack.frames.len() + 1);
    if multi {
        names.push(sanitize(&p.process_label(stack.pid)));
    }
    if stack.truncated {
        names.push(TRUNCATED.to_string());
    }
    // Frames are stored leaf first; folded stacks are root first.
    names.extend(
        stack
            .frames
            .iter()
            .rev()
            .map(|f| sanitize(&f.display_name())),
    );
    if stack.frames.is_empty() {
        names.push(NO_STACK.to_string());
    }
    names.join(";")
}

/// Makes a name safe inside a folded line: ';' separates frames and a line
/// break would end the line, so neither may appear in a name. C++ and Rust
/// names can contain ';' (e.g. `[u8; 8]`).
fn sanitize(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_control())
        .map(|c| if c == ';' { ':' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_keeps_frames_apart() {
        assert_eq!(sanitize("f<[u8; 8]>\n"), "f<[u8: 8]>");
    }
}
