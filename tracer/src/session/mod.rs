//! One tracing session, in phases: settings derived once from the command
//! line (`Settings`), then attach, collect, finish and report (`Trace`).
//! A snapshot of the profile can be taken at any moment of the trace
//! without stopping it (`Trace::snapshot`); the report at the end is the
//! last snapshot.

mod binary;
mod cgroup;
mod cgroup_members;
pub mod config;
mod end_reason;
mod facts;
mod finish;
pub mod forks;
mod loading;
mod memory_watch;
mod memory_watcher;
mod peak_snapshots;
mod phases;
pub mod progress;
pub mod scope;
mod settings;
mod single;
mod snapshots;
mod stats;
mod trace_loop;

use std::time::{Duration, Instant};

use anyhow::Context as _;
use end_reason::EndReason;
pub use settings::limits_of;

use crate::{
    collect::{
        collector::{Collector, CollectorOptions},
        profile::{self, Meta},
        InUseFilter,
    },
    console, escape, otlp,
    probes::{
        counters::read_losses,
        hooks::Hooks,
        kernel_features::KernelFeatures,
        loader::{self, Loaded},
    },
    report::{self, Profile},
    serve,
    session::{
        config::TraceConfig,
        peak_snapshots::PeakSnapshots,
        scope::Scope,
        settings::Settings,
        trace_loop::{Phase, Signals},
    },
    stacks::symbolize::Names,
};

/// Runs the trace and writes the report; returns the exit code (0, or the
/// command's own status with --exit-status).
pub fn run(config: &TraceConfig) -> anyhow::Result<u8> {
    // Before anything is attached: an unwritable -o must not cost a trace.
    let settings = Settings::new(config)?;
    let bound = match &config.serve {
        Some(addr) => Some(serve::Bound::bind(*addr)?),
        None => None,
    };
    // Signal handlers first: a Ctrl-C, SIGTERM or SIGHUP that comes while
    // probes are being attached, or just after, ends the trace with its
    // report instead of killing the tracer.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let signals = {
        let _in_runtime = runtime.enter();
        Signals::install()?
    };
    let mut trace = Trace::attach(&settings, signals, &runtime)?;
    let server = match bound {
        Some(bound) => {
            let (server, requests) = bound.start(trace.scope.target())?;
            trace.serve = Some(requests);
            Some(server)
        }
        None => None,
    };
    let end_reason = runtime.block_on(trace.collect(Phase::Trace {
        duration: config.duration,
    }))?;
    let command_note = trace.end_command(&end_reason, |trace| {
        runtime.block_on(trace.collect(Phase::WindDown))
    })?;
    // The runtime no longer listens for signals: from here on, one
    // abandons a report write that blocks (a pipe nobody reads) and is
    // acknowledged at once.
    report::output::abandon_blocked_writes_on_signal();
    // The server stops with the trace; the report follows.
    if let Some(server) = server {
        server.stop();
    }
    let duration = trace.started.elapsed();
    let mut phases = phases::Phases::start(config.verbose);
    trace.finish()?;
    phases.mark("drained");
    // Debug files still on their way are waited for, within a budget; a
    // signal ends the wait.
    let wait = crate::stacks::debuginfod::REPORT_WAIT;
    trace
        .names
        .wait_for_downloads(wait, report::output::abandoned);
    // The history's last point is the report's time.
    let mut profile = trace.snapshot_at(&end_reason, duration, InUseFilter::aged(config.min_age));
    phases.mark("profile built");
    profile.sort_stacks(config.render.sort);
    profile.notes.extend(command_note);
    // The last push, waited for a few seconds at most; the report says
    // what became of them all.
    if let Some(push) = trace.otlp.take() {
        let note = push.finish(&profile);
        profile.notes.push(note);
    }
    let status = trace.report(&profile, &mut phases);
    phases.mark("trace closed");
    phases.say();
    // As the trace's state (see `report`): the process exits next.
    std::mem::forget(profile);
    status
}

/// A trace in progress: what was attached, and what was collected so far.
pub struct Trace<'a> {
    settings: &'a Settings<'a>,
    signals: Signals,
    scope: Scope,
    loaded: Loaded,
    hooks: Hooks,
    collector: Collector,
    /// Frames named so far: a snapshot names only the new ones.
    names: Names,
    started: Instant,
    /// `started` on the realtime clock, in ns since the Unix epoch (None if
    /// the clock is set before 1970), for the profile's start.
    started_unix_ns: Option<u64>,
    /// History ticks so far (--interval, --serve).
    snapshots: u32,
    /// Numbered snapshots written so far (`{n}` in -o: history ticks and
    /// --snapshot-on-peak).
    numbered: u32,
    /// What --snapshot-on-peak wrote.
    peak_snapshots: PeakSnapshots,
    /// --verbose: the periodic stats line.
    stats: stats::Stats,
    /// --serve: the server's requests for snapshots.
    serve: Option<serve::SnapshotRequests>,
    /// --otlp: the pushes to the collector.
    otlp: Option<otlp::Push>,
    /// The probes being detached once the trace is finished.
    detaching: Option<loader::Detaching>,
    /// The kernel's memory numbers of what is traced.
    memory: memory_watcher::MemoryWatcher,
}

impl<'a> Trace<'a> {
    /// Finds the target, loads the BPF object and attaches the probes.
    fn attach(
        settings: &'a Settings<'a>,
        mut signals: Signals,
        runtime: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Trace<'a>> {
        let config = settings.config;
        // A DEBUGINFOD_URLS that does not parse is said before anything is attached.
        let names = Names::new(crate::stacks::debuginfod::Debuginfod::from_env()?);
        let features = KernelFeatures::probe()?;
        let mut scope = Scope::start(config, features.ancestor_cgroup)?;
        let (mut loaded, mut maps) = loading::load(
            runtime,
            &mut signals,
            settings.limits(&scope),
            features,
            config.verbose,
        )?;
        if config.verbose {
            loading::say_mode(&loaded, settings.attach.sessions);
        }
        let mut modules = loading::modules(&mut maps, &scope);
        let mut hooks = Hooks::new(settings.choice.clone(), settings.attach, config.verbose);
        scope.hook_initial(&mut loaded, &mut hooks)?;
        // The heap is counted from here on (a started command runs from
        // `begin`): the kernel's first reading is taken now.
        let mut memory = memory_watch::MemoryWatch::new(scope.root(), scope.memory_files());
        loading::prepare_tables(&mut modules, &scope, &hooks);
        if config.verbose {
            loading::say_code_gen_and_sessions(&loaded);
        }
        for pid in scope.begin(config, &mut loaded, &mut hooks)? {
            modules.refresh(pid);
        }
        hooks.announce_from_now();
        let collector = Collector::new(
            maps,
            modules,
            CollectorOptions {
                sampling: config.probes.sampling,
                max_live: config.probes.max_live,
                trace_root: scope.root(),
                keep_exited: config.exited_processes,
                program_hint: scope.binary(),
                snapshot_on_peak: config.snapshot_on_peak,
            },
        )?;
        // "tracing" once the ring buffer's reader runs (mapping a big ring
        // buffer takes a while): what a process does from then on is read
        // while it still runs, so its identity (start time, command, cgroup)
        // is its own, not that of a later process given its pid.
        finish::announce(config, &scope, &hooks);
        let started = Instant::now();
        memory.set_started(started);
        let memory = memory_watcher::MemoryWatcher::start(memory, settings.tick);
        Ok(Trace {
            settings,
            signals,
            scope,
            loaded,
            hooks,
            collector,
            names,
            started,
            started_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .and_then(|d| u64::try_from(d.as_nanos()).ok()),
            snapshots: 0,
            numbered: 0,
            peak_snapshots: PeakSnapshots::default(),
            stats: stats::Stats::new(),
            serve: None,
            otlp: settings.otlp.clone().map(otlp::Push::start).transpose()?,
            detaching: None,
            memory,
        })
    }

    /// Ends the trace: freezes the heap as it is now (calls already inside
    /// the allocator get a moment to return), drains everything they
    /// emitted, handles the last execs and lets a held command go. The
    /// probes are detached while the report is built (`report` waits).
    fn finish(&mut self) -> anyhow::Result<()> {
        // The kernel's last reading, just before the heap stops being
        // counted: a block allocated after it is counted by the heap only
        // (a share over 100 % is capped), not by the kernel only, which
        // would read as memory the allocator never handed out.
        self.memory.finish();
        self.loaded.stop()?;
        std::thread::sleep(trace_loop::STOP_GRACE);
        self.collector.drain_all();
        self.service_child();
        self.scope
            .on_process_changes(self.collector.take_process_changes());
        // An exec in the last moments of the trace: its process is named
        // for its new image, as one earlier would be.
        self.handle_execs(trace_loop::FINAL_EXEC_BUDGET);
        self.scope.let_go();
        if self.settings.config.verbose {
            let kernel = self.collector.kernel_unwind(&self.loaded.counters);
            finish::print_stats(&self.collector, kernel);
            if self.loaded.sessions_attached() {
                finish::print_return_runs(crate::probes::counters::read_return_runs(
                    &self.loaded.counters,
                ));
            }
        }
        // Stopped, the last exec handled: nothing is attached from here.
        self.detaching = Some(self.loaded.detach_in_background());
        Ok(())
    }

    /// The profile as it is now, the trace going on: what every process
    /// traced allocated since the start and still holds, with names.
    pub fn snapshot(&mut self, end_reason: &EndReason) -> Profile {
        let elapsed = self.started.elapsed();
        let in_use = InUseFilter::aged(self.settings.config.min_age);
        self.snapshot_at(end_reason, elapsed, in_use)
    }

    /// `snapshot`, counting as in use only the blocks `in_use` keeps.
    pub fn snapshot_filtered(&mut self, end_reason: &EndReason, in_use: InUseFilter) -> Profile {
        let elapsed = self.started.elapsed();
        self.snapshot_at(end_reason, elapsed, in_use)
    }

    /// The profile as it is now, `elapsed` after the trace started (its
    /// duration, and the time of its last history point), counting as in
    /// use only the blocks `in_use` keeps.
    fn snapshot_at(
        &mut self,
        end_reason: &EndReason,
        elapsed: Duration,
        in_use: InUseFilter,
    ) -> Profile {
        let probes = self.settings.config.probes;
        let mut processes = self.scope.processes(self.collector.processes());
        for p in &mut processes {
            let objects = self.hooks.process_objects(p.pid, !p.exited);
            p.allocators = facts::process_allocators(&objects);
        }
        self.memory.fill(&mut processes);
        let meta = Meta {
            target: self.scope.target(),
            processes,
            duration: elapsed,
            started: self.started,
            started_unix_ns: self.started_unix_ns,
            end_reason: end_reason.to_string(),
            hooks: facts::report_hooks(self.hooks.lines()),
            unwind: self.loaded.unwind(),
            stack_bytes: probes.stack_bytes,
            sampling: probes.sampling,
            session_error: self.loaded.session_error.clone(),
            unwind_fallback: self.loaded.fallback().map(str::to_string),
            allocators: self.hooks.objects().to_vec(),
            scope_notes: finish::scope_notes(
                &self.scope,
                &self.loaded,
                &self.hooks,
                &self.collector,
                self.started,
            ),
            root_exit_kept: self.scope.root().is_some(),
            traced_from_start: self.scope.traced_from_start(),
            min_age: in_use.min_age,
            born_since_ns: in_use.born_since_ns,
            kernel_unwind: self.collector.kernel_unwind(&self.loaded.counters),
            cgroup_memory: self.memory.cgroup_memory(),
            resident_now: self.memory.resident(),
        };
        let losses = self.collector.losses(read_losses(&self.loaded.counters));
        let mut profile = profile::build(meta, &self.collector, losses, &mut self.names);
        profile.group_by = self.settings.config.render.group_by;
        profile.notes.extend(self.peak_snapshots.note());
        profile
            .notes
            .extend(self.memory.bound_note().map(crate::report::Note::Text));
        profile
    }

    /// Writes the final report, detaches, and says how the trace went.
    fn report(mut self, profile: &Profile, phases: &mut phases::Phases) -> anyhow::Result<u8> {
        let config = self.settings.config;
        let written = match self.settings.numbered() {
            true => self
                .settings
                .write_numbered(self.numbered + 1, profile, true)?,
            false => self.settings.write(profile)?,
        };
        phases.mark("written");
        if profile.totals.alloc_objects == 0 && profile.not_freed_at_exit.objects == 0 {
            console::warn(format_args!(
                "no allocation through {} was seen during the trace: the target was idle, or it \
                 allocates with an allocator that is not hooked",
                escape::text(&self.hooks.objects().join(", "))
            ));
        }
        let status = self.scope.command_status();
        // Started when the trace was finished: it changes nothing in the
        // report, and waits on the kernel while the report is built.
        if let Some(detaching) = self.detaching.take() {
            detaching.wait()?;
        }
        phases.mark("detached");
        // Sampling: the numbers are estimates from the sampled allocations,
        // not counts of them.
        let about = if profile.sampling().is_exact() {
            ""
        } else {
            "about "
        };
        // The last line says what was lost, if anything: the report's
        // losses may go to a file nobody reads at once.
        let lost = match profile.losses.lost() {
            0 => String::new(),
            n => format!(
                "; WARNING: {} lost ({}), the numbers are incomplete",
                report::counted(n, "event", "events"),
                profile.losses.lost_words()
            ),
        };
        console::say(format_args!(
            "{} after {:.1} s: {about}{} {}, {about}{} still live ({}){}{lost}",
            profile.end_reason,
            profile.duration_secs,
            report::counted(profile.totals.alloc_objects, "allocation", "allocations"),
            if profile.sampling().is_exact() {
                "recorded"
            } else {
                "estimated from samples"
            },
            profile.totals.inuse_objects,
            report::counted(profile.totals.inuse_bytes, "byte", "bytes"),
            written
                .map(|path| format!("; report written to {}", escape::path(&path)))
                .unwrap_or_default()
        ));
        // The tracer exits next: freeing what the trace built block by
        // block gains nothing (100 k stacks took 0.6-0.8 s here).
        self.collector.leak_state();
        std::mem::forget(self.names);
        // Known: without --keep-running a command is waited for until it
        // ends.
        Ok(match config.exit_status {
            true => status.unwrap_or(0),
            false => 0,
        })
    }
}
