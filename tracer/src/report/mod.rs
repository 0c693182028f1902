//! The report: one `Profile` value, and renderers that take `&Profile` and
//! `impl Write`. Renderers know nothing of BPF.

use serde::Serialize;

use crate::profile::Sampling;

// The profile's data, defined in crate::profile, named here too for the
// renderers and their callers.
pub use crate::profile::{
    CgroupRemoval, Counts, ExitStack, Frame, GroupBy, Hook, Identity, Losses, NotFreedAtExit, Note,
    Peak, ProcessAllocator, ProcessInfo, Profile, SnapshotPoint, StackReport, Trend,
    MAX_EXIT_STACKS,
};

pub mod allocator_frames;
mod churn_text;
mod collapsed;
mod distinct;
mod flamegraph;
mod groups;
mod groups_text;
mod growth;
mod interruptible;
mod json;
mod json_layout;
mod losses;
pub mod memory_text;
mod notes;
mod notes_cgroup;
mod otlp;
pub mod output;
mod pprof;
mod pprof_meta;
mod render;
mod speedscope;
mod symbol_notes;
mod text;
mod text_parts;
mod text_peak;

pub use collapsed::{folded_text_bytes, write_collapsed};
pub use flamegraph::{write_flamegraph, write_flamegraph_of};
pub use groups::Group;
pub use growth::{rate_per_min, sparkline, Sort};
pub use json::{write_json, PtrMap};
pub use losses::{write_losses, LossLine};
pub use otlp::{
    otlp_request, proto as otlp_proto, Host as OtlpHost, SAMPLE_TYPES as OTLP_SAMPLE_TYPES,
};
pub use output::Output;
pub use pprof::{sample_type_name, write_pprof};
pub use render::{check_destination, losses_for_stderr, render, Format, RenderOptions};
pub use speedscope::write_speedscope;
pub use text::{write_text, write_text_by};
// For saved profiles (crate::saved): reading pprof, naming folded frames.
pub use collapsed::sanitize as folded_name;
pub use output::Render;
pub use pprof::proto;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod tests;

/// Which of the four numbers a collapsed stack or flamegraph shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum View {
    #[default]
    InuseSpace,
    InuseObjects,
    AllocSpace,
    AllocObjects,
    /// In use at the peak of each stack's process (docs/peak.md).
    PeakSpace,
    PeakObjects,
}

impl View {
    pub fn value(self, c: &Counts) -> u64 {
        match self {
            View::InuseSpace => c.inuse_bytes,
            View::InuseObjects => c.inuse_objects,
            View::AllocSpace => c.alloc_bytes,
            View::AllocObjects => c.alloc_objects,
            View::PeakSpace => c.peak_inuse_bytes,
            View::PeakObjects => c.peak_inuse_objects,
        }
    }

    /// Unit name for flamegraph titles and counts.
    pub fn unit(self) -> &'static str {
        match self {
            View::InuseSpace | View::AllocSpace | View::PeakSpace => "bytes",
            View::InuseObjects | View::AllocObjects | View::PeakObjects => "objects",
        }
    }
}

impl View {
    /// What the numbers mean, for titles: "in-use bytes", "allocated objects"...
    pub fn describe(self) -> &'static str {
        match self {
            View::InuseSpace => "in-use bytes",
            View::InuseObjects => "in-use objects",
            View::AllocSpace => "allocated bytes",
            View::AllocObjects => "allocated objects",
            View::PeakSpace => "bytes in use at the peak",
            View::PeakObjects => "objects in use at the peak",
        }
    }
}

/// The name symbolization gives a frame it could not name.
const UNKNOWN: &str = "[unknown]";

/// Shown in place of a call stack that was not captured (see
/// the counter `stack_lost`), so the bytes still appear somewhere.
const NO_STACK: &str = "[no stack]";

/// The root frame of a stack whose walk ended early (`StackReport::truncated`).
const TRUNCATED: &str = "[truncated]";

impl Frame {
    /// True when the symbolizer could not name this frame.
    pub fn is_unknown(&self) -> bool {
        self.function.is_empty() || self.function == UNKNOWN
    }

    /// The object file the frame's code is in; None when it is in none
    /// known.
    pub fn object(&self) -> Option<&str> {
        let module = self.module.as_str();
        (!module.is_empty() && module != UNKNOWN).then_some(module)
    }

    /// The name every renderer shows: the function, or for a frame that
    /// could not be named `[unknown] libfoo.so+0x1a2b`, so that distinct
    /// unknown code stays distinct and can be looked up by hand.
    pub fn display_name(&self) -> String {
        if !self.is_unknown() {
            return self.function.clone();
        }
        match self.object() {
            None => format!("{UNKNOWN}+{:#x}", self.offset),
            Some(module) => format!("{UNKNOWN} {}+{:#x}", basename(module), self.offset),
        }
    }
}

/// `value` bytes in the largest binary unit that keeps it at 1024 or
/// more of the unit below: (1.5, "KiB") for 1536.
pub fn binary_unit(value: f64) -> (f64, &'static str) {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = value;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = next;
    }
    (value, unit)
}

/// `512 B`, `1.5 KiB`, `3.2 GiB`: binary units with one decimal.
pub fn human_bytes(bytes: u64) -> String {
    // Precision loss in the cast is irrelevant at one decimal.
    match binary_unit(bytes as f64) {
        (_, "B") => format!("{bytes} B"),
        (value, unit) => format!("{value:.1} {unit}"),
    }
}

/// `1 stack`, `2 stacks`: a count with its noun in the right number.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", plural(n, one, many))
}

/// `one` for a count of 1, `many` for any other: "was" or "were", "its"
/// or "their". The one plural rule of every message.
pub fn plural<'a>(n: u64, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 {
        one
    } else {
        many
    }
}

/// Last path component: reports name objects by file name, as perf does.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

impl Profile {
    /// `redis-server (pid 4242)`: the program name of process `pid`, or
    /// "pid" when it is unknown (also for pids missing from `processes`,
    /// e.g. children that appeared during the trace). Without `program`
    /// the first word of the command line stands in.
    pub fn process_label(&self, pid: u32, start_time: Option<u64>) -> String {
        let program = self
            .processes
            .iter()
            .find(|proc| proc.pid == pid && proc.start_time == start_time)
            .or_else(|| self.processes.iter().find(|proc| proc.pid == pid))
            .and_then(|proc| match proc.program.as_str() {
                "" => proc.command.split_whitespace().next(),
                program => Some(program),
            })
            .map_or("pid", basename);
        format!("{program} (pid {pid})")
    }

    /// How a stack's process is named in collapsed stacks and flamegraphs:
    /// `redis-server (pid 4242)`, or `python3.11 (812 exited processes)`
    /// for a folded group.
    pub fn stack_label(&self, stack: &StackReport) -> String {
        let Some(program) = &stack.exited_group else {
            return self.process_label(stack.pid, stack.start_time);
        };
        let n = self
            .processes
            .iter()
            .find(|p| p.folded > 0 && &p.program == program)
            .map_or(0, |p| p.folded);
        format!(
            "{} ({})",
            basename(program),
            counted(n, "exited process", "exited processes")
        )
    }

    /// True when stacks of several processes are mixed in this profile, so
    /// renderers must say which process each stack belongs to.
    pub fn is_multi_process(&self) -> bool {
        let key = |s: &StackReport| (s.pid, s.start_time, s.exited_group.clone());
        let first = self.stacks.first().map(key);
        self.processes.len() > 1 || self.stacks.iter().any(|s| Some(key(s)) != first)
    }

    /// How allocations were chosen, in words.
    pub fn sampling_description(&self) -> String {
        // 0 is not a meaningful mean interval: shown like 1 rather than
        // inventing a rate.
        match self.sampling() {
            Sampling::Exact => "every allocation (exact)".to_string(),
            Sampling::Bytes(rate) => {
                format!("one sample per {rate} bytes allocated on average (numbers are estimates)")
            }
        }
    }

    /// --min-age, for the text header and pprof's comments.
    pub fn min_age_description(&self) -> Option<String> {
        self.min_age_secs.map(|secs| {
            format!(
                "{secs} s: in use counts only allocations live at least that long; \
                 allocated counts every allocation"
            )
        })
    }
}
