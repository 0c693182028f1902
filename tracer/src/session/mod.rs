//! One tracing session: preflight, attach, collect until the end condition,
//! detach, drain, report.

mod facts;
pub mod forks;
pub mod scope;

use std::{
    io::Write,
    os::fd::AsRawFd,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    cli::{Cli, Format},
    collect::collector::{read_losses, Collector},
    collect::profile::{self, Meta},
    escape,
    probes::hooks::Hooks,
    probes::loader::{self, Limits},
    report::{self, Output},
    session::scope::{Scope, Start},
    stacks::symbolize::Modules,
    target::allocators::Choice,
};

/// How often the ring buffer is drained (BPF submits without wakeups).
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often --binary looks for new processes running the program.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long one turn of the trace's loop may spend on execs, and the end
/// of the trace on those left (see `handle_execs`).
const EXEC_BUDGET: Duration = Duration::from_millis(20);
const FINAL_EXEC_BUDGET: Duration = Duration::from_millis(200);
/// How long calls already inside the allocator get to return after the stop.
const STOP_GRACE: Duration = Duration::from_millis(20);
/// How long a started command gets to exit after the trace ended first and
/// it was sent SIGTERM (or SIGINT), before SIGKILL.
const COMMAND_GRACE: Duration = Duration::from_secs(5);

/// What ends a collection phase.
#[derive(Clone, Copy)]
enum Phase {
    /// The trace: the duration, the target's exit, SIGINT or SIGTERM.
    Trace { duration: Option<f64> },
    /// A started command was told to stop: its exit; SIGKILL when the grace
    /// time is over or another SIGINT/SIGTERM comes.
    WindDown,
}

/// Runs the trace and writes the report; returns the exit code (0, or the
/// command's own status with --exit-status).
pub fn run(cli: &Cli) -> anyhow::Result<u8> {
    // Before anything is attached: an unwritable -o must not cost a trace.
    let output = cli.output.as_deref().map(Output::prepare).transpose()?;
    crate::probes::preflight::check(cli)?;
    // Signal handlers first: a Ctrl-C or SIGTERM that comes while probes
    // are being attached, or just after, ends the trace with its report
    // instead of killing the tracer.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let mut signals = {
        let _in_runtime = runtime.enter();
        Signals::install()?
    };
    let Start {
        mut scope,
        maps: initial_maps,
    } = Scope::start(cli)?;
    let mut comm = [0u8; 16];
    for (d, s) in comm
        .iter_mut()
        .zip(cli.comm.as_deref().unwrap_or("").bytes())
    {
        *d = s;
    }
    let limits = Limits {
        max_live: cli.max_live,
        stack_storage_size: cli.stack_storage_size,
        ringbuf_bytes: cli.ringbuf_mb << 20,
        unwind: cli.unwind,
        stack_bytes: cli.stack_bytes,
        sample_rate: cli.sample_rate,
        filter: scope.filter(),
        comm,
        follow_forks: scope.follows_forks(),
    };
    let (mut loaded, maps) = loader::load(&limits)?;
    let mut modules = Modules::default();
    for (pid, mappings) in initial_maps {
        modules.set_maps(pid, mappings);
    }
    let mut hooks = Hooks::new(
        Choice::parse(&cli.allocator),
        loader::AttachOptions {
            placement: cli.probe_placement,
            noop: cli.noop_probes,
            sessions: cli.uprobe_sessions == crate::cli::Sessions::Auto,
        },
    );
    scope.hook_initial(&mut loaded, &mut hooks)?;
    if let (Some(why), true) = (&loaded.session_error, cli.verbose) {
        eprintln!(
            "memtrace-bpf: uprobe sessions unavailable, using uprobes + uretprobes: {}",
            escape::text(why)
        );
    }
    scope.begin(cli, &mut loaded, &mut hooks, &mut modules)?;
    hooks.announce = true;
    hooks.verbose = cli.verbose;
    let started = Instant::now();
    if cli.verbose {
        for h in &hooks.lines {
            eprintln!(
                "memtrace-bpf: {} at {}+{:#x}: {}; probes at {:#x}: {}",
                escape::text(&h.function),
                escape::text(&h.module),
                h.offset,
                escape::text(&h.status.to_string()),
                h.probe_offset,
                escape::text(&h.placement)
            );
        }
    }
    // Paths the traced processes chose: escaped for the terminal.
    let hooked = escape::text(&hooks.objects.join(", ")).into_owned();
    if matches!(scope, Scope::SystemWide) {
        eprintln!(
            "memtrace-bpf: warning: tracing every process that uses {hooked}: each of them pays \
             the probe cost on every allocation while the trace runs"
        );
    }
    let functions = hooks
        .lines
        .iter()
        .filter(|h| h.status.is_attached())
        .count();
    eprintln!(
        "memtrace-bpf: tracing {}: {} hooked in {hooked}; {}",
        scope.label(),
        report::counted(
            functions as u64,
            "allocator function",
            "allocator functions"
        ),
        match cli.duration {
            Some(d) => format!("reporting in {d} s or on Ctrl-C"),
            None => "press Ctrl-C to stop and report".to_string(),
        }
    );

    let mut collector = Collector::new(maps, modules, cli.sample_rate, scope.root())?;
    collector.state.processes.program_hint = scope.binary();
    let end_reason = runtime.block_on(collect(
        &mut collector,
        &mut scope,
        &mut loaded,
        &mut hooks,
        &mut signals,
        Phase::Trace {
            duration: cli.duration,
        },
    ))?;
    let command_note = end_command(cli, &end_reason, &mut scope, |scope| {
        runtime.block_on(collect(
            &mut collector,
            scope,
            &mut loaded,
            &mut hooks,
            &mut signals,
            Phase::WindDown,
        ))
    })?;
    let duration = started.elapsed();
    // Freeze the heap as it is now; calls already inside the allocator get
    // a moment to return, then everything they emitted is drained.
    loaded.stop()?;
    std::thread::sleep(STOP_GRACE);
    collector.drain_all();
    scope.service_child(|pid| collector.drain_exiting(pid));
    scope.on_process_changes(std::mem::take(&mut collector.state.process_changes));
    // An exec in the last moments of the trace: its process is named for
    // its new image, as one earlier would be.
    handle_execs(
        &mut collector,
        &mut scope,
        &mut loaded,
        &mut hooks,
        FINAL_EXEC_BUDGET,
    );
    scope.let_go();
    let losses = read_losses(&loaded.counters);
    if cli.verbose {
        print_stats(&collector);
    }

    let mut processes = scope.processes(&collector.state.processes);
    for p in &mut processes {
        p.allocators = facts::process_allocators(&hooks.process_objects(p.pid));
    }
    let mut scope_notes = scope.notes();
    scope_notes.extend(scope.fork_notes(&loaded));
    scope_notes.extend(command_note);
    for (pid, why) in &hooks.failures {
        scope_notes.push(format!(
            "process {pid}: its allocator could not be hooked: {why}"
        ));
    }
    let skipped = collector.state.execs_skipped + collector.state.execs.len() as u64;
    if skipped > 0 {
        scope_notes.push(format!(
            "{} not inspected: the trace saw programs start faster than their objects could \
             be read (allocators they brought may not have been hooked; glibc is hooked for all)",
            report::counted(skipped, "exec was", "execs were"),
        ));
    }
    if collector.state.heap.dropped_by_exec > 0 {
        let n = collector.state.heap.dropped_by_exec;
        scope_notes.push(format!(
            "{} still live when {} process called exec {} dropped from in-use \
             (the new image does not have {})",
            report::counted(n, "block", "blocks"),
            if n == 1 { "its" } else { "their" },
            report::was(n),
            if n == 1 { "it" } else { "them" },
        ));
    }
    let meta = Meta {
        target: scope.target(),
        processes,
        duration,
        end_reason,
        hooks: facts::report_hooks(&hooks.lines),
        unwind: cli.unwind,
        stack_bytes: cli.stack_bytes,
        sample_rate: cli.sample_rate,
        session_error: loaded.session_error.clone(),
        allocators: hooks.objects.clone(),
        scope_notes,
        root_exit_kept: scope.root().is_some(),
    };
    let profile = profile::build(meta, &collector, losses);
    write_report(cli, output.as_ref(), &profile)?;
    if profile.totals.alloc_objects == 0 {
        eprintln!(
            "memtrace-bpf: warning: no allocation through {hooked} was seen during the trace: \
             the target was idle, or it allocates with an allocator that is not hooked"
        );
    }
    // After the report: detaching takes seconds and changes nothing in it.
    loader::detach(loaded)?;
    eprintln!(
        "memtrace-bpf: {} after {:.1} s: {} recorded, {} still live ({}){}",
        profile.end_reason,
        profile.duration_secs,
        report::counted(profile.totals.alloc_objects, "allocation", "allocations"),
        profile.totals.inuse_objects,
        report::counted(profile.totals.inuse_bytes, "byte", "bytes"),
        output
            .as_ref()
            .map(|o| format!("; report written to {}", escape::path(o.path())))
            .unwrap_or_default()
    );
    if cli.exit_status {
        // Known: without --keep-running a command is waited for until it
        // ends.
        return Ok(scope.command_status().unwrap_or(0));
    }
    Ok(0)
}

/// The trace ended before the command it started: the command is told to
/// stop, as perf record does, and `wind_down` goes on collecting until it
/// ends (what it does while shutting down is recorded); with
/// --keep-running it is left running. Returns the report's note.
fn end_command(
    cli: &Cli,
    end_reason: &str,
    scope: &mut Scope,
    wind_down: impl FnOnce(&mut Scope) -> anyhow::Result<String>,
) -> anyhow::Result<Option<String>> {
    let Some(command) = scope.running_command() else {
        return Ok(None);
    };
    let pid = command.pid;
    if cli.keep_running {
        return Ok(Some(format!(
            "the command (pid {pid}) was left running, no longer traced (--keep-running)"
        )));
    }
    let (sig, name) = if end_reason.starts_with("interrupted") {
        (libc::SIGINT, "SIGINT")
    } else {
        (libc::SIGTERM, "SIGTERM")
    };
    command.signal(sig);
    // A stopped (SIGSTOP, Ctrl-Z) command acts on it only once continued,
    // as shells do for `kill` on a stopped job.
    command.signal(libc::SIGCONT);
    let how = wind_down(scope)?;
    Ok(Some(format!(
        "the trace ended before the command (pid {pid}): it was sent {name} and {how}"
    )))
}

/// The signals a trace reacts to, installed before anything is attached.
struct Signals {
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    sigchld: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            sigint: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            sigterm: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            sigchld: signal(SignalKind::child()).context("installing SIGCHLD handler")?,
        })
    }
}

/// Drains events until the phase ends (see `Phase`). Returns why it ended.
async fn collect(
    collector: &mut Collector,
    scope: &mut Scope,
    loaded: &mut loader::Loaded,
    hooks: &mut Hooks,
    signals: &mut Signals,
    phase: Phase,
) -> anyhow::Result<String> {
    let Signals {
        sigint,
        sigterm,
        sigchld,
    } = signals;
    let exit_fd = scope.exit_fd().map(|pidfd| pidfd.fd.as_raw_fd());
    let exit = match exit_fd {
        // SAFETY: the scope owns the pidfd and is borrowed for this whole
        // function, so the raw fd stays open while the AsyncFd exists.
        Some(fd) => Some(
            unsafe { AsyncFd::register(fd) }
                .map_err(|e| anyhow::anyhow!("watching the target for exit: {e}"))?,
        ),
        None => None,
    };
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // SAFETY: the collector, which owns the ring buffer, is borrowed for
    // this whole function, so the fd stays open while the AsyncFd exists.
    let events =
        unsafe { AsyncFd::register_with_interest(collector.events_fd(), Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
    let now = tokio::time::Instant::now();
    let mut deadline = match phase {
        Phase::Trace { duration } => duration.map(|d| now + Duration::from_secs_f64(d)),
        Phase::WindDown => Some(now + COMMAND_GRACE),
    };
    // Why the command was killed, in the wind-down.
    let mut killed: Option<String> = None;
    let mut tick = tokio::time::interval(DRAIN_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            // In the wind-down, a second Ctrl-C stops waiting for the command.
            _ = sigint.recv() => match phase {
                Phase::Trace { .. } => return Ok("interrupted (SIGINT)".into()),
                Phase::WindDown => {
                    killed = Some("on a second SIGINT".into());
                    kill_command(scope, &mut deadline);
                }
            },
            _ = sigterm.recv() => match phase {
                Phase::Trace { .. } => return Ok("terminated (SIGTERM)".into()),
                Phase::WindDown => {
                    killed = Some("on a second SIGTERM".into());
                    kill_command(scope, &mut deadline);
                }
            },
            _ = exited(exit.as_ref()) => return Ok(match (phase, killed) {
                (Phase::Trace { .. }, _) => "target exited".into(),
                (Phase::WindDown, Some(why)) => format!("was killed (SIGKILL) {why}"),
                (Phase::WindDown, None) => "exited".into(),
            }),
            _ = poll.tick() => scope.poll(loaded, hooks, &mut collector.state.modules),
            _ = sigchld.recv() => scope.service_child(|pid| collector.drain_exiting(pid)),
            _ = sleep_until(deadline) => match phase {
                Phase::Trace { .. } => return Ok("duration elapsed".into()),
                Phase::WindDown => {
                    killed = Some(format!(
                        "when it had not exited within {} s",
                        COMMAND_GRACE.as_secs()
                    ));
                    kill_command(scope, &mut deadline);
                }
            },
            _ = tick.tick() => { collector.drain(); }
            guard = events.readable() => {
                collector.drain();
                if let Ok(mut guard) = guard {
                    guard.clear_ready();
                }
            }
        }
        scope.on_process_changes(std::mem::take(&mut collector.state.process_changes));
        handle_execs(collector, scope, loaded, hooks, EXEC_BUDGET);
    }
}

/// Handles the execs seen so far, oldest first, for at most `budget`.
/// Reading a new image's objects takes milliseconds; on a host that starts
/// hundreds of programs a second it must not keep the loop from draining
/// events, or from ending the trace: the rest wait for the next turn.
fn handle_execs(
    collector: &mut Collector,
    scope: &mut Scope,
    loaded: &mut loader::Loaded,
    hooks: &mut Hooks,
    budget: Duration,
) {
    let start = Instant::now();
    let mut done = 0;
    while done < collector.state.execs.len() && start.elapsed() < budget {
        let pid = collector.state.execs[done];
        done += 1;
        // Gone already: nothing left to read, and no failure to hook.
        if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok() {
            scope.on_exec(pid, loaded, hooks, &mut collector.state.modules);
        }
    }
    collector.state.execs.drain(..done);
}

/// SIGKILL to a started command still running; no more deadline.
fn kill_command(scope: &mut Scope, deadline: &mut Option<tokio::time::Instant>) {
    if let Some(command) = scope.running_command() {
        command.signal(libc::SIGKILL);
    }
    *deadline = None;
}

async fn exited(exit: Option<&AsyncFd<std::os::fd::RawFd>>) {
    match exit {
        Some(fd) => {
            let _ = fd.readable().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Renders the report in memory, then writes it to stdout or, atomically,
/// to the `-o` file (which saves it elsewhere if that fails, and says so).
fn write_report(
    cli: &Cli,
    output: Option<&Output>,
    profile: &report::Profile,
) -> anyhow::Result<()> {
    // Streamed to its destination, never held whole in memory.
    let mut render = |mut w: &mut dyn Write| -> anyhow::Result<()> {
        match cli.format {
            Format::Text => Ok(report::write_text(profile, cli.top, &mut w)?),
            Format::Json => report::write_json(profile, &mut w),
            Format::Collapsed => Ok(report::write_collapsed(profile, cli.view, &mut w)?),
            Format::Flamegraph => report::write_flamegraph(profile, cli.view, &mut w),
        }
    };
    match output {
        Some(output) => output.write_with(&mut render)?,
        None => {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            render(&mut out).context("writing the report to stdout")?;
            out.flush().context("writing the report to stdout")?;
        }
    }
    if matches!(cli.format, Format::Collapsed | Format::Flamegraph) {
        // These formats have no place for them: the counters go to stderr.
        let mut err = std::io::stderr().lock();
        report::write_losses(&profile.losses, &mut err)?;
    }
    Ok(())
}

/// `--verbose`: what user space spent, for tuning and `cargo xtask bench`.
fn print_stats(collector: &Collector) {
    eprintln!(
        "memtrace-bpf: LIVE map: {} entries at the end; {} entries of exited processes deleted",
        collector.state.live_entries(),
        collector.state.purged_live
    );
    let u = collector.state.unwinders.stats;
    if u.stacks > 0 {
        let secs = u.nanos as f64 / 1e9;
        eprintln!(
            "memtrace-bpf: unwound {} ({}, {} truncated) in {:.1} ms: {:.0} stacks/s",
            report::counted(u.stacks, "stack", "stacks"),
            report::counted(u.frames, "frame", "frames"),
            u.truncated,
            secs * 1e3,
            u.stacks as f64 / secs.max(1e-9)
        );
        if let (Some(p50), Some(p99), Some(max)) = (
            u.depth_quantile(0.5),
            u.depth_quantile(0.99),
            u.depth_quantile(1.0),
        ) {
            eprintln!(
                "memtrace-bpf: stack bytes complete stacks needed: p50 {p50}, p99 {p99}, max {max} (--stack-bytes)"
            );
        }
    }
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct we pass.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0 {
        // SAFETY: initialized by the successful call above.
        let u = unsafe { usage.assume_init() };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        eprintln!(
            "memtrace-bpf: tracer CPU {:.3} s user, {:.3} s system; peak RSS {} KiB",
            secs(u.ru_utime),
            secs(u.ru_stime),
            u.ru_maxrss
        );
    }
}
