//! What the command line decides, derived once: where and how the report
//! is written, the BPF object's limits, and how probes are attached.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    cli::{Cli, Format, SNAPSHOT_NUMBER},
    probes::loader::{AttachOptions, Limits},
    report::{self, Output, Profile},
    session::scope::Scope,
    tracee::allocators::Choice,
};

/// History tick with --serve and no --interval.
pub const SERVE_TICK: Duration = Duration::from_secs(5);

pub struct Settings<'a> {
    pub cli: &'a Cli,
    /// -o, checked writable before anything is attached; with `{n}`, the
    /// first snapshot's file was checked.
    output: Option<Output>,
    /// How often the heap's history is recorded: --interval, or with
    /// --serve alone every `SERVE_TICK` (the live page's chart).
    pub tick: Option<Duration>,
    pub choice: Choice,
    pub attach: AttachOptions,
    /// --comm, NUL-padded as the BPF side compares it.
    comm: [u8; 16],
}

impl<'a> Settings<'a> {
    /// Checks what can be checked before attaching: the output path and
    /// the privileges.
    pub fn new(cli: &'a Cli) -> anyhow::Result<Settings<'a>> {
        let output = cli
            .output
            .as_deref()
            .map(|path| Output::prepare(&numbered_path(path, 1)))
            .transpose()?;
        crate::probes::preflight::check(cli)?;
        let mut comm = [0u8; 16];
        for (d, s) in comm
            .iter_mut()
            .zip(cli.comm.as_deref().unwrap_or("").bytes())
        {
            *d = s;
        }
        Ok(Settings {
            cli,
            output,
            tick: cli
                .interval
                .map(Duration::from_secs_f64)
                .or(cli.serve.as_ref().map(|_| SERVE_TICK)),
            choice: Choice::parse(&cli.allocator),
            attach: AttachOptions {
                placement: cli.probe_placement,
                noop: cli.noop_probes,
                sessions: cli.uprobe_sessions == crate::cli::Sessions::Auto,
            },
            comm,
        })
    }

    /// The BPF object's sizes and filters for tracing `scope`.
    pub fn limits(&self, scope: &Scope) -> Limits {
        let cli = self.cli;
        Limits {
            max_live: cli.max_live,
            stack_storage_size: cli.stack_storage_size,
            ringbuf_bytes: cli.ringbuf_mb << 20,
            unwind: cli.unwind,
            stack_bytes: cli.stack_bytes,
            unwind_rows: cli.unwind_rows,
            sample_rate: cli.sample_rate,
            filter: scope.filter(),
            comm: self.comm,
            follow_forks: scope.follows_forks(),
        }
    }

    /// -o has `{n}`: each tick writes a numbered snapshot, and the final
    /// report is the last one.
    pub fn numbered(&self) -> bool {
        self.cli
            .output
            .as_ref()
            .is_some_and(|o| o.to_string_lossy().contains(SNAPSHOT_NUMBER))
    }

    /// Writes the report to stdout or, atomically, to the -o file (which
    /// saves it elsewhere if that fails, and says so). Returns the file.
    pub fn write(&self, profile: &Profile) -> anyhow::Result<Option<PathBuf>> {
        write_report(self.cli, self.output.as_ref(), profile, true)?;
        Ok(self.output.as_ref().map(|o| o.path().to_path_buf()))
    }

    /// Writes snapshot `n` to the -o path with `{n}` replaced; `last`: the
    /// final report (collapsed and flamegraph then print the loss counters
    /// on stderr).
    pub fn write_numbered(
        &self,
        n: u32,
        profile: &Profile,
        last: bool,
    ) -> anyhow::Result<Option<PathBuf>> {
        let Some(path) = &self.cli.output else {
            return self.write(profile);
        };
        let output = Output::prepare(&numbered_path(path, n))?;
        write_report(self.cli, Some(&output), profile, last)?;
        Ok(Some(output.path().to_path_buf()))
    }
}

/// `path` with `{n}` replaced by `n` (unchanged without it).
fn numbered_path(path: &Path, n: u32) -> PathBuf {
    let text = path.to_string_lossy();
    match text.contains(SNAPSHOT_NUMBER) {
        true => PathBuf::from(text.replace(SNAPSHOT_NUMBER, &n.to_string())),
        false => path.to_path_buf(),
    }
}

/// Renders the report straight to stdout or the `-o` file, never held
/// whole in memory.
fn write_report(
    cli: &Cli,
    output: Option<&Output>,
    profile: &Profile,
    losses_to_stderr: bool,
) -> anyhow::Result<()> {
    let mut render = |mut w: &mut dyn Write| -> anyhow::Result<()> {
        match cli.format {
            Format::Text => Ok(report::write_text_by(profile, cli.top, cli.sort(), &mut w)?),
            Format::Json => report::write_json(profile, &mut w),
            Format::Collapsed => Ok(report::write_collapsed(profile, cli.view, &mut w)?),
            Format::Flamegraph => report::write_flamegraph(profile, cli.view, &mut w),
            Format::Pprof => report::write_pprof(profile, cli.view, &mut w),
            Format::Speedscope => report::write_speedscope(profile, cli.view, &mut w),
        }
    };
    let (started, before) = (std::time::Instant::now(), crate::usage::own());
    match output {
        Some(output) => output.write_with(&mut render)?,
        None => report::output::write_stdout(&mut render)?,
    }
    if cli.verbose {
        // For `cargo xtask bench-report`: what rendering alone costs. The
        // allocator keeps most of what was freed, so RSS after rendering
        // is close to its peak during it.
        let after = crate::usage::own();
        eprintln!(
            "memtrace-bpf: report rendered in {:.1} ms; RSS +{} KiB (peak RSS +{} KiB)",
            started.elapsed().as_secs_f64() * 1e3,
            after.rss_kib.saturating_sub(before.rss_kib),
            after.peak_rss_kib.saturating_sub(before.peak_rss_kib)
        );
    }
    if losses_to_stderr
        && matches!(
            cli.format,
            Format::Collapsed | Format::Flamegraph | Format::Pprof | Format::Speedscope
        )
    {
        // These formats have no place for them: the counters go to stderr.
        let mut err = std::io::stderr().lock();
        report::write_losses(&profile.losses, &mut err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_in_the_output_path_is_the_snapshot_number() {
        let p = |s: &str, n| numbered_path(Path::new(s), n);
        assert_eq!(p("/tmp/heap-{n}.json", 12), Path::new("/tmp/heap-12.json"));
        assert_eq!(p("/tmp/{n}/h{n}", 3), Path::new("/tmp/3/h3"));
        assert_eq!(p("/tmp/heap.json", 3), Path::new("/tmp/heap.json"));
    }
}
