//! The diff written out: text, collapsed, a differential flamegraph, JSON
//! and pprof (the changes as values).

use std::{
    collections::HashMap,
    io::{self, Write},
};

use anyhow::{bail, Context as _};
use flate2::{write::GzEncoder, Compression};
use inferno::{
    differential,
    flamegraph::{self, Options},
};
use prost::Message as _;
use serde::Serialize;

use super::{sub, Change, Diff, Side, DIFF_FORMAT};
use crate::{
    escape,
    report::{folded_name, proto, Counts, View},
};

impl Diff {
    /// `root;...;leaf VALUE` of `view` for one side (`new` or old).
    fn folded(&self, view: View, new: bool) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let v = view.value(if new { &e.new } else { &e.old });
            if v > 0 {
                out.push_str(&folded_stack(self.frames(e)));
                out.push_str(&format!(" {v}\n"));
            }
        }
        out
    }

    /// The bytes `folded` of both sides takes, at most.
    fn folded_bytes(&self, view: View) -> usize {
        let lens: Vec<usize> = self.names.iter().map(|n| folded_name(n).len()).collect();
        let mut total = 0usize;
        for e in &self.entries {
            let sides = [&e.old, &e.new].into_iter().filter(|c| view.value(c) > 0);
            // Names, `;` between them, ` VALUE\n` after (at most 22 bytes).
            let line: usize = e
                .frames
                .iter()
                .map(|&id| lens[id as usize] + 1)
                .sum::<usize>()
                + 21;
            total = total.saturating_add(sides.count() * line);
        }
        total
    }

    pub fn write_text(&self, view: View, top: usize, w: &mut impl Write) -> io::Result<()> {
        let (old, new) = (view.value(&self.old.totals), view.value(&self.new.totals));
        writeln!(w, "memtrace-bpf diff: {}, NEW − OLD", view.describe())?;
        writeln!(
            w,
            "  OLD {} ({})",
            escape::text(&self.old.file),
            escape::text(&self.old.target)
        )?;
        writeln!(
            w,
            "  NEW {} ({})",
            escape::text(&self.new.file),
            escape::text(&self.new.target)
        )?;
        writeln!(w, "total: old {old}, new {new}, change {:+}", sub(new, old))?;
        let ranked = self.ranked(view);
        writeln!(
            w,
            "{} stacks changed, {} unchanged; top {} by absolute change:",
            ranked.len(),
            self.entries.len() - ranked.len(),
            top.min(ranked.len())
        )?;
        for (i, e) in ranked.iter().take(top).enumerate() {
            writeln!(w)?;
            writeln!(
                w,
                "#{} change {:+} {} (old {}, new {})",
                i + 1,
                e.change(view),
                view.unit(),
                view.value(&e.old),
                view.value(&e.new)
            )?;
            for f in self.frames(e) {
                writeln!(w, "    {}", escape::text(f))?;
            }
        }
        Ok(())
    }

    /// Signed changes, one line per stack whose `view` changed, sorted by
    /// stack.
    pub fn write_collapsed(&self, view: View, w: &mut impl Write) -> io::Result<()> {
        for e in &self.entries {
            let change = e.change(view);
            if change != 0 {
                writeln!(w, "{} {change}", folded_stack(self.frames(e)))?;
            }
        }
        Ok(())
    }

    /// inferno's differential flamegraph: widths are NEW, red where a stack
    /// grew, blue where it shrank.
    pub fn write_flamegraph(&self, view: View, w: &mut impl Write) -> anyhow::Result<()> {
        crate::saved::limits::check_flamegraph_text(self.folded_bytes(view))?;
        let (before, after) = (self.folded(view, false), self.folded(view, true));
        if after.is_empty() {
            // inferno draws NEW's widths; it would say "No stack counts found".
            bail!(
                "NEW ({}) has no {}: a differential flamegraph draws NEW's stacks, so there is \
                 nothing to draw (--format text or collapsed show what shrank)",
                self.new.file,
                view.describe()
            );
        }
        let mut lines = Vec::new();
        differential::from_readers(
            differential::Options::default(),
            before.as_bytes(),
            after.as_bytes(),
            &mut lines,
        )
        .context("matching the stacks with inferno")?;
        let lines = String::from_utf8(lines).context("inferno's differential output")?;
        let mut opts = Options::default();
        opts.title = format!("memtrace-bpf diff: {}", view.describe());
        opts.subtitle = Some(format!(
            "{} → {} (red grew, blue shrank)",
            escape::text(&self.old.file),
            escape::text(&self.new.file)
        ));
        opts.count_name = view.unit().to_string();
        opts.deterministic = true;
        flamegraph::from_lines(&mut opts, lines.lines(), w)
            .context("rendering the flamegraph with inferno")
    }

    pub fn write_json(&self, view: View, w: &mut impl Write) -> anyhow::Result<()> {
        let stacks: Vec<JsonStack<'_>> = self
            .ranked(view)
            .into_iter()
            .map(|e| JsonStack {
                frames: Names(self.frames(e).collect()),
                old: e.old,
                new: e.new,
                change: Change::of(&e.old, &e.new),
            })
            .collect();
        let doc = JsonDiff {
            format: DIFF_FORMAT,
            view,
            old: &self.old,
            new: &self.new,
            change: Change::of(&self.old.totals, &self.new.totals),
            stacks,
        };
        // ASCII-only output: every string a profile holds is a \u escape
        // here, so the file is safe on a terminal and exact for a parser.
        let mut text = serde_json::to_string_pretty(&doc).context("writing the diff as JSON")?;
        text = ascii_json(&text);
        w.write_all(text.as_bytes())?;
        writeln!(w)?;
        Ok(())
    }

    /// A pprof profile of NEW − OLD (negative values allowed), as `go tool
    /// pprof -diff_base OLD NEW` computes it.
    pub fn write_pprof(&self, view: View, w: &mut impl Write) -> anyhow::Result<()> {
        let pb = self.pprof(view);
        let mut gz = GzEncoder::new(w, Compression::fast());
        gz.write_all(&pb.encode_to_vec())
            .context("cannot write the pprof profile")?;
        gz.finish()
            .and_then(|w| w.flush())
            .context("cannot write the pprof profile")
    }

    fn pprof(&self, view: View) -> proto::Profile {
        let mut b = PprofBuilder::default();
        b.string(""); // index 0 is "" in every pprof string table
        let sample_type = [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space",
            "peak_objects",
            "peak_space",
        ]
        .iter()
        .map(|t| {
            b.value_type(
                t,
                if t.ends_with("space") {
                    "bytes"
                } else {
                    "count"
                },
            )
        })
        .collect();
        let mut sample = Vec::new();
        for e in &self.entries {
            let change = Change::of(&e.old, &e.new);
            if change == Change::default() {
                continue;
            }
            let location_id = self.frames(e).map(|f| b.location(f)).collect();
            sample.push(proto::Sample {
                location_id,
                value: change.pprof_values(),
                label: Vec::new(),
            });
        }
        let default_sample_type = b.string(crate::report::sample_type_name(view));
        let comment = vec![b.string(&format!(
            "memtrace-bpf diff: {} − {}",
            escape::text(&self.new.file),
            escape::text(&self.old.file)
        ))];
        proto::Profile {
            sample_type,
            sample,
            default_sample_type,
            comment,
            period_type: Some(b.value_type("space", "bytes")),
            location: std::mem::take(&mut b.locations),
            function: std::mem::take(&mut b.functions),
            string_table: std::mem::take(&mut b.strings),
            ..Default::default()
        }
    }
}

/// Frames as a folded stack, root first, each name made safe for a
/// folded line (report/collapsed.rs).
fn folded_stack<'a>(frames: impl DoubleEndedIterator<Item = &'a str>) -> String {
    let names: Vec<String> = frames.rev().map(folded_name).collect();
    names.join(";")
}

/// `text` (JSON) with every non-ASCII character written as `\uNNNN`: only
/// possible inside strings, where that escape means the same character.
fn ascii_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[derive(Serialize)]
struct JsonDiff<'a> {
    format: &'static str,
    view: View,
    old: &'a Side,
    new: &'a Side,
    change: Change,
    stacks: Vec<JsonStack<'a>>,
}

#[derive(Serialize)]
struct JsonStack<'a> {
    frames: Names<'a>,
    old: Counts,
    new: Counts,
    change: Change,
}

/// A stack's frame names, as a JSON list.
#[derive(Serialize)]
#[serde(transparent)]
struct Names<'a>(Vec<&'a str>);

/// String table, functions and locations of the diff's pprof: one
/// function and one location per distinct frame name.
#[derive(Default)]
struct PprofBuilder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: Vec<proto::Function>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<String, u64>,
}

impl PprofBuilder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = i64::try_from(self.strings.len()).unwrap_or(i64::MAX);
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, t: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(t),
            unit: self.string(unit),
        }
    }

    fn location(&mut self, frame: &str) -> u64 {
        if let Some(&id) = self.location_ids.get(frame) {
            return id;
        }
        // `go tool pprof` prints names to a terminal.
        let name = self.string(&escape::text(frame));
        let id = self.locations.len() as u64 + 1;
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            ..Default::default()
        });
        self.locations.push(proto::Location {
            id,
            line: vec![proto::Line {
                function_id: id,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.location_ids.insert(frame.to_string(), id);
        id
    }
}
