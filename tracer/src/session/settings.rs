//! What the command line decides, derived once: where and how the report
//! is written, the BPF object's limits, and how probes are attached.

use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use crate::{
    limits::SNAPSHOT_NUMBER,
    probes::{loader::AttachOptions, Limits},
    report::{self, Output, Profile},
    session::{config::TraceConfig, scope::Scope},
    tracee::allocators::Choice,
};

/// History tick with --serve and no --interval.
pub const SERVE_TICK: Duration = Duration::from_secs(5);

pub struct Settings<'a> {
    pub config: &'a TraceConfig,
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
    /// --otlp: where profiles are pushed.
    pub otlp: Option<crate::otlp::Destination>,
}

/// The BPF object's sizes, unwinding and sampling chosen by `probes`, with
/// a pid-set filter of no pid.
pub fn limits_of(probes: &crate::session::config::ProbeChoice) -> Limits {
    Limits {
        max_live: probes.max_live,
        stack_storage_size: probes.stack_storage_size,
        ringbuf_bytes: probes.ringbuf_mb << 20,
        unwind: probes.unwind,
        stack_bytes: probes.stack_bytes,
        sampling: probes.sampling,
        unwind_rows: probes.unwind_rows,
        filter: tracer_common::FILTER_PIDS,
        comm: [0; 16],
        follow_forks: false,
        cgroup: crate::probes::CgroupFilter::default(),
        settings_in_map: false,
    }
}

impl<'a> Settings<'a> {
    /// Checks what can be checked before attaching: the output path and
    /// the privileges.
    pub fn new(config: &'a TraceConfig) -> anyhow::Result<Settings<'a>> {
        let output = config
            .output
            .as_deref()
            .map(|path| Output::prepare(&numbered_path(path, 1)))
            .transpose()?;
        // A bad URL or header list is said before anything is attached.
        let otlp = config
            .otlp
            .as_deref()
            .map(crate::otlp::destination)
            .transpose()?;
        crate::probes::preflight::check(config.pid(), config.command().is_some())?;
        let mut comm = [0u8; 16];
        let name = match &config.target {
            crate::session::config::Target::SystemWide {
                comm: Some(name), ..
            } => name.as_str(),
            _ => "",
        };
        for (d, s) in comm.iter_mut().zip(name.bytes()) {
            *d = s;
        }
        Ok(Settings {
            config,
            output,
            tick: config.interval.or(config.serve.map(|_| SERVE_TICK)),
            choice: Choice::parse(&config.allocator),
            attach: AttachOptions {
                placement: config.probes.placement,
                noop: config.probes.noop,
                sessions: config.probes.sessions,
            },
            comm,
            otlp,
        })
    }

    /// The BPF object's sizes and filters for tracing `scope`.
    pub fn limits(&self, scope: &Scope) -> Limits {
        Limits {
            filter: scope.filter(),
            comm: self.comm,
            follow_forks: scope.follows_forks(),
            cgroup: scope.cgroup_filter(),
            ..limits_of(&self.config.probes)
        }
    }

    /// -o has `{n}`: each tick writes a numbered snapshot, and the final
    /// report is the last one.
    pub fn numbered(&self) -> bool {
        self.config
            .output
            .as_ref()
            .is_some_and(|o| o.to_string_lossy().contains(SNAPSHOT_NUMBER))
    }

    /// Writes the report to stdout or, atomically, to the -o file (which
    /// saves it elsewhere if that fails, and says so). Returns the file.
    pub fn write(&self, profile: &Profile) -> anyhow::Result<Option<PathBuf>> {
        write_report(self.config, self.output.as_ref(), profile, true)?;
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
        let Some(path) = &self.config.output else {
            return self.write(profile);
        };
        let numbered = numbered_path(path, n);
        let output = match Output::prepare(&numbered) {
            Ok(output) => output,
            // The final report is kept whatever became of its directory
            // during the trace: saved elsewhere, the error says where.
            Err(refused) if last => {
                let elsewhere = Output::elsewhere(&numbered);
                write_report(self.config, Some(&elsewhere), profile, last)?;
                return Err(refused.context(format!(
                    "the report could not be written to {}; it was saved to {} instead",
                    numbered.display(),
                    elsewhere.path().display()
                )));
            }
            Err(refused) => return Err(refused),
        };
        write_report(self.config, Some(&output), profile, last)?;
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
    config: &TraceConfig,
    output: Option<&Output>,
    profile: &Profile,
    losses_to_stderr: bool,
) -> anyhow::Result<()> {
    let r = config.render;
    let options = report::RenderOptions {
        format: r.format,
        view: r.view,
        top: r.top,
        sort: r.sort,
    };
    let mut render = |w: &mut dyn Write| report::render(profile, &options, w);
    let (started, before) = (std::time::Instant::now(), crate::usage::own());
    match output {
        Some(output) => output.write_with(&mut render)?,
        None => report::output::write_stdout(&mut render)?,
    }
    if config.verbose {
        // For `cargo xtask bench-report`: what rendering alone costs. The
        // allocator keeps most of what was freed, so RSS after rendering
        // is close to its peak during it.
        let after = crate::usage::own();
        crate::console::say(format_args!(
            "report rendered in {:.1} ms; RSS +{} KiB (peak RSS +{} KiB)",
            started.elapsed().as_secs_f64() * 1e3,
            after.rss_kib.saturating_sub(before.rss_kib),
            after.peak_rss_kib.saturating_sub(before.peak_rss_kib)
        ));
    }
    if !losses_to_stderr {
        return Ok(());
    }
    if let Some(losses) = report::losses_for_stderr(profile, r.format) {
        crate::console::lines(&losses)?;
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
