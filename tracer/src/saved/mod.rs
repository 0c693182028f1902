//! Saved profiles: `memtrace-bpf report FILE` re-renders a saved profile,
//! `memtrace-bpf diff OLD NEW` compares two. Neither loads BPF, checks
//! capabilities nor reads /proc: main.rs dispatches them before anything
//! privileged, so any user can run them on files they can read.
//!
//! A saved file is input like any other: it is read up to `MAX_INPUT_BYTES`
//! (compressed and decompressed), parsed within `MAX_PROFILE_BYTES` of
//! memory, every index and number in it is checked, and a file of another
//! kind is named for what it looks like (limits.rs, input.rs): a malformed
//! file gives an error naming it, never a panic.

use std::{
    ffi::OsString,
    io::{IsTerminal as _, Write},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand, ValueEnum};

use crate::report::{self, Format, Output, Profile, RenderOptions, Sort, View};

mod diff;
mod input;
mod limits;
mod pb_scan;
mod read_json;
mod read_pprof;

pub use diff::{Diff, DiffEntry};
pub use limits::{MAX_COUNT, MAX_INPUT_BYTES, MAX_PROFILE_BYTES};

use input::Kind;
use limits::Budget;

/// True when the command line is one of these subcommands: the first
/// argument is `report` or `diff` (a trace's own options all start with
/// `-`, and a command to trace comes after `--`).
pub fn is_subcommand(first: Option<&OsString>) -> bool {
    first.is_some_and(|a| a == "report" || a == "diff")
}

/// Work on saved profiles (no privileges needed).
#[derive(Debug, Parser)]
#[command(name = "memtrace-bpf", version)]
pub struct SavedCli {
    #[command(subcommand)]
    pub command: SavedCommand,
}

#[derive(Debug, Subcommand)]
pub enum SavedCommand {
    /// Re-render a saved profile (memtrace-bpf JSON, or a pprof file) in
    /// any format.
    Report(ReportArgs),
    /// Per-stack differences NEW − OLD between two saved profiles
    /// (memtrace-bpf JSON or pprof, gzip-compressed or not).
    Diff(DiffArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// The saved profile (`--format json` output, or a pprof file; either
    /// may be gzip-compressed).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Which number collapsed stacks and flamegraphs show, and pprof's
    /// default sample type.
    #[arg(long, value_enum, default_value_t = View::InuseSpace)]
    pub view: View,
    /// Number of stacks in the text report.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Order of stacks in text and JSON: by in-use bytes, or by growth
    /// (needs a profile saved with --interval history). Default: growth
    /// when the profile has growth rates, inuse otherwise.
    #[arg(long, value_enum, value_name = "ORDER")]
    pub sort: Option<Sort>,
    /// The top level of the text report, the root frame of collapsed
    /// stacks and flamegraphs, and JSON's grouping (default: as the trace
    /// grouped it). Group by cgroup or container needs a profile saved by
    /// a trace that read the processes' cgroups (JSON; pprof files keep no
    /// identities).
    #[arg(long, value_enum, value_name = "BY")]
    pub group_by: Option<crate::profile::GroupBy>,
    /// Write the report here instead of stdout.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct DiffArgs {
    /// The earlier profile.
    #[arg(value_name = "OLD")]
    pub old: PathBuf,
    /// The later profile: changes are NEW − OLD.
    #[arg(value_name = "NEW")]
    pub new: PathBuf,
    #[arg(short, long, value_enum, default_value_t = DiffFormat::Text)]
    pub format: DiffFormat,
    /// Which number text, collapsed and flamegraph compare, and pprof's
    /// default sample type.
    #[arg(long, value_enum, default_value_t = View::InuseSpace)]
    pub view: View,
    /// Number of stacks in the text report.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Write the diff here instead of stdout.
    #[arg(short, long, value_name = "PATH")]
    pub output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    /// Stacks ranked by the largest absolute change, with totals.
    Text,
    /// `root;...;leaf CHANGE`, signed.
    Collapsed,
    /// inferno's differential flamegraph (red grew, blue shrank).
    Flamegraph,
    /// The diff document (schema in docs/formats.md).
    Json,
    /// Gzip-compressed pprof with NEW − OLD values, as `go tool pprof
    /// -diff_base` makes.
    Pprof,
}

/// Runs a subcommand; the exit status is 0, 1 (error) or 2 (bad usage).
pub fn main(args: Vec<OsString>) -> std::process::ExitCode {
    // argv[0] first, as clap expects.
    let cli = SavedCli::parse_from(std::iter::once(OsString::from("memtrace-bpf")).chain(args));
    let top = match &cli.command {
        SavedCommand::Report(a) => a.top,
        SavedCommand::Diff(a) => a.top,
    };
    if top == 0 {
        // A bad command line, as for a trace: status 2.
        crate::console::error(
            "--top must be at least 1: it is how many stacks the text report lists",
        );
        return std::process::ExitCode::from(2);
    }
    let result = match &cli.command {
        SavedCommand::Report(a) => run_report(a),
        SavedCommand::Diff(a) => run_diff(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Errors quote file names and names read from those files.
            crate::console::error(crate::escape::text(&format!("{err:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_report(a: &ReportArgs) -> anyhow::Result<()> {
    let output = prepare_output(a.output.as_deref(), a.format)?;
    let mut profile = load(&a.file)?;
    if let Some(group_by) = a.group_by {
        profile.group_by = group_by;
    }
    let sort = sort_stacks(&mut profile, a.sort, &a.file)?;
    if a.format == Format::Flamegraph {
        limits::check_flamegraph_text(report::folded_text_bytes(&profile, a.view))?;
    }
    let options = RenderOptions {
        format: a.format,
        view: a.view,
        top: a.top,
        sort,
    };
    write_out(output.as_ref(), &mut |w: &mut dyn Write| {
        report::render(&profile, &options, w)
    })
}

fn run_diff(a: &DiffArgs) -> anyhow::Result<()> {
    let as_report = match a.format {
        DiffFormat::Text => Format::Text,
        DiffFormat::Collapsed => Format::Collapsed,
        DiffFormat::Flamegraph => Format::Flamegraph,
        DiffFormat::Json => Format::Json,
        DiffFormat::Pprof => Format::Pprof,
    };
    let output = prepare_output(a.output.as_deref(), as_report)?;
    let old = load(&a.old)?;
    let new = load(&a.new)?;
    let d = Diff::new(
        &old,
        &new,
        &a.old.to_string_lossy(),
        &a.new.to_string_lossy(),
    );
    let (format, view, top) = (a.format, a.view, a.top);
    write_out(output.as_ref(), &mut |mut w: &mut dyn Write| match format {
        DiffFormat::Text => Ok(d.write_text(view, top, &mut w)?),
        DiffFormat::Collapsed => Ok(d.write_collapsed(view, &mut w)?),
        DiffFormat::Flamegraph => d.write_flamegraph(view, &mut w),
        DiffFormat::Json => d.write_json(view, &mut w),
        DiffFormat::Pprof => d.write_pprof(view, &mut w),
    })
}

/// Checks `-o` before any file is read, and refuses to write a format
/// that is no text for a terminal to one, as a trace does.
fn prepare_output(path: Option<&Path>, format: Format) -> anyhow::Result<Option<Output>> {
    if let Some(path) = path {
        return Output::prepare(path).map(Some);
    }
    report::check_destination(format, false, std::io::stdout().is_terminal())
        .map_err(anyhow::Error::msg)?;
    Ok(None)
}

fn write_out(output: Option<&Output>, render: &mut report::Render<'_>) -> anyhow::Result<()> {
    match output {
        Some(output) => output.write_with(render),
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            match render(&mut out).and_then(|()| Ok(out.flush()?)) {
                // The reader stopped reading (`| head`): the saved file is
                // still there, so nothing is lost; quiet, as other tools.
                Err(e) if broken_pipe(&e) => {
                    // Nothing more can be written: drop the buffer unflushed.
                    let _ = out.into_parts();
                    Ok(())
                }
                written => written.context("writing to stdout"),
            }
        }
    }
}

fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `--sort`: the order asked for, or growth when the profile has growth
/// rates (as a trace with --interval does) and in-use otherwise. A saved
/// profile keeps the order it was written in, so in-use is sorted again.
pub(crate) fn sort_stacks(
    p: &mut Profile,
    asked: Option<Sort>,
    file: &Path,
) -> anyhow::Result<Sort> {
    let has_rates = p.stacks.iter().any(|s| s.growth_bytes_per_sec.is_some());
    let sort = match asked {
        Some(Sort::Growth) if !has_rates => bail!(
            "{}: this profile has no history (no growth rates): --sort growth needs a profile \
             saved from a trace with --interval; use --sort inuse",
            // Escaped where the error is printed (main).
            file.to_string_lossy()
        ),
        Some(sort) => sort,
        None if has_rates => Sort::Growth,
        None => Sort::Inuse,
    };
    match sort {
        Sort::Growth => p.sort_stacks(Sort::Growth),
        Sort::Inuse => p.stacks.sort_by(|a, b| {
            (b.counts.inuse_bytes, b.counts.alloc_bytes)
                .cmp(&(a.counts.inuse_bytes, a.counts.alloc_bytes))
        }),
    }
    Ok(sort)
}

/// Reads a saved profile: memtrace-bpf JSON or pprof, either one
/// gzip-compressed or not, told apart by their first bytes; memory and
/// numbers bounded (limits.rs). Errors name the file.
pub fn load(path: &Path) -> anyhow::Result<Profile> {
    // Raw: an error is escaped where it is printed, the target by each
    // renderer (escaping here too would double every backslash).
    let shown = path.to_string_lossy();
    let mut profile = input::read(path)
        .and_then(|(bytes, kind)| parse(bytes, kind))
        .with_context(|| format!("{shown} is not a profile memtrace-bpf can read"))?;
    if profile.target.is_empty() {
        // pprof files do not name what was traced: the file stands in.
        profile.target = format!("file {shown}");
    }
    Ok(profile)
}

/// `load` of a file's bytes (fuzzing.rs).
pub fn load_bytes(raw: &[u8]) -> anyhow::Result<Profile> {
    input::decode(raw).and_then(|(bytes, kind)| parse(bytes, kind))
}

fn parse(bytes: Vec<u8>, kind: Kind) -> anyhow::Result<Profile> {
    let mut budget = Budget::new(MAX_PROFILE_BYTES);
    let p = match kind {
        Kind::Json => read_json::parse(bytes, &mut budget)?,
        Kind::Protobuf => read_pprof::parse(bytes, &mut budget)?,
    };
    limits::check(&p)?;
    Ok(p)
}

#[cfg(test)]
mod tests;
