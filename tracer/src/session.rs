//! One tracing session: preflight, attach, collect until the end condition,
//! detach, drain, report.

use std::{
    fs::File,
    io::{BufWriter, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    cli::{Cli, Format},
    collector::{read_losses, Collector},
    error::TraceError,
    launch::Launched,
    loader::{self, Limits, GLIBC_HOOKS},
    profile::{self, Meta},
    report,
    symbolize::Modules,
    target::Process,
};

/// How often the ring buffer is drained (BPF submits without wakeups).
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How long calls already inside the allocator get to return after the stop.
const STOP_GRACE: Duration = Duration::from_millis(20);

pub fn run(cli: &Cli) -> anyhow::Result<()> {
    crate::preflight::check()?;
    // A command is started held (see launch.rs) and hooked in the libc this
    // tracer uses: it runs on the same system. A pid is inspected as it is.
    let mut launched = None;
    let (pid, command, libc, mappings) = match cli.pid {
        Some(pid) => {
            let process = Process::inspect(pid)?;
            let libc = process.libc_path()?;
            (pid, process.command, libc, process.mappings)
        }
        None => {
            let started = Launched::spawn(&cli.command)?;
            let me = Process::inspect(std::process::id())?;
            let libc = me.libc_path()?;
            let pid = started.pid;
            launched = Some(started);
            (pid, cli.command.join(" "), libc, Vec::new())
        }
    };
    // Opened before attaching, so a reused pid cannot fool the exit check.
    let pidfd = PidFd::open(pid)?;

    let limits = Limits {
        max_live: cli.max_live,
        stack_storage_size: cli.stack_storage_size,
        ringbuf_bytes: cli.ringbuf_mb << 20,
        unwind: cli.unwind,
        stack_bytes: cli.stack_bytes,
        sample_rate: cli.sample_rate,
    };
    let (mut loaded, maps) = loader::load(&limits)?;
    let mut modules = Modules::default();
    if !mappings.is_empty() {
        modules.set_maps(pid, mappings);
    }
    let hooks = loader::attach(
        &mut loaded,
        GLIBC_HOOKS,
        &crate::target::host_path(pid, &libc),
        &libc,
        pid,
        &loader::AttachOptions {
            placement: cli.probe_placement,
            noop: cli.noop_probes,
            sessions: cli.uprobe_sessions == crate::cli::Sessions::Auto,
        },
    )?;
    if let (Some(why), true) = (&loaded.session_error, cli.verbose) {
        eprintln!("memtrace-bpf: uprobe sessions unavailable, using uprobes + uretprobes: {why}");
    }
    if pidfd.has_exited() {
        return Err(TraceError::ExitedBeforeAttach(pid).into());
    }
    let started = Instant::now();
    let attached: Vec<&str> = hooks
        .iter()
        .filter(|h| h.status.starts_with("attached"))
        .map(|h| h.function.as_str())
        .collect();
    if cli.verbose {
        for h in &hooks {
            eprintln!(
                "memtrace-bpf: {} at {}+{:#x}: {}; probes at {:#x}: {}",
                h.function, h.module, h.offset, h.status, h.probe_offset, h.placement
            );
        }
    }
    if let Some(started) = &mut launched {
        started.release()?;
    }
    eprintln!(
        "memtrace-bpf: tracing pid {pid} ({command}): {} hooked in {libc}; {}",
        attached.join(", "),
        match cli.duration {
            Some(d) => format!("reporting in {d} s or on Ctrl-C"),
            None => "press Ctrl-C to stop and report".to_string(),
        }
    );

    let mut collector = Collector::new(maps.events, maps.stacks, modules, cli.sample_rate);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let end_reason = runtime.block_on(collect(&mut collector, &pidfd, cli.duration))?;
    let duration = started.elapsed();
    // Freeze the heap as it is now; calls already inside the allocator get
    // a moment to return, then everything they emitted is drained.
    loaded.stop()?;
    std::thread::sleep(STOP_GRACE);
    collector.drain();
    let losses = read_losses(&loaded.counters);
    if cli.verbose {
        print_stats(&collector);
    }

    let meta = Meta {
        target: match &launched {
            Some(started) => format!("command {}", started.path.display()),
            None => format!("pid {pid}"),
        },
        pid,
        command,
        exited: pidfd.has_exited(),
        exit_status: launched.as_ref().and_then(Launched::exit_status),
        duration,
        end_reason,
        hooks,
        unwind: cli.unwind,
        stack_bytes: cli.stack_bytes,
        sample_rate: cli.sample_rate,
        session_error: loaded.session_error.clone(),
    };
    let profile = profile::build(meta, &collector, losses);
    write_report(cli, &profile)?;
    if profile.totals.alloc_objects == 0 {
        eprintln!(
            "memtrace-bpf: warning: pid {pid} made no allocation through {libc} during the trace: \
             it was idle, or it allocates with another allocator (only glibc's is hooked)"
        );
    }
    // After the report: detaching takes seconds and changes nothing in it.
    loader::detach(loaded)?;
    eprintln!(
        "memtrace-bpf: {} after {:.1} s: {} allocations recorded, {} still live ({} bytes){}",
        profile.end_reason,
        profile.duration_secs,
        profile.totals.alloc_objects,
        profile.totals.inuse_objects,
        profile.totals.inuse_bytes,
        cli.output
            .as_ref()
            .map(|p| format!("; report written to {}", p.display()))
            .unwrap_or_default()
    );
    Ok(())
}

/// Drains events until the duration ends, the target exits, or SIGINT /
/// SIGTERM arrives. Returns why it stopped.
async fn collect(
    collector: &mut Collector,
    pidfd: &PidFd,
    duration: Option<f64>,
) -> anyhow::Result<String> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    // SAFETY: the pidfd is borrowed for this whole function, so the raw fd
    // stays open for as long as the AsyncFd exists.
    let exit = unsafe { AsyncFd::register(pidfd.fd.as_raw_fd()) }
        .map_err(|e| anyhow::anyhow!("watching the target for exit: {e}"))?;
    // SAFETY: the collector, which owns the ring buffer, is borrowed for
    // this whole function, so the fd stays open while the AsyncFd exists.
    let events =
        unsafe { AsyncFd::register_with_interest(collector.events_fd(), Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
    let deadline = duration.map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d));
    let mut tick = tokio::time::interval(DRAIN_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = sigint.recv() => return Ok("interrupted (SIGINT)".into()),
            _ = sigterm.recv() => return Ok("terminated (SIGTERM)".into()),
            _ = exit.readable() => return Ok("target exited".into()),
            _ = sleep_until(deadline) => return Ok("duration elapsed".into()),
            _ = tick.tick() => { collector.drain(); }
            guard = events.readable() => {
                collector.drain();
                if let Ok(mut guard) = guard {
                    guard.clear_ready();
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn write_report(cli: &Cli, profile: &report::Profile) -> anyhow::Result<()> {
    let mut out: Box<dyn Write> = match &cli.output {
        Some(path) => {
            Box::new(File::create(path).with_context(|| format!("creating {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut w = BufWriter::new(&mut out);
    match cli.format {
        Format::Text => report::write_text(profile, cli.top, &mut w)?,
        Format::Json => report::write_json(profile, &mut w)?,
        Format::Collapsed => report::write_collapsed(profile, cli.view, &mut w)?,
        Format::Flamegraph => report::write_flamegraph(profile, cli.view, &mut w)?,
    }
    w.flush().context("writing the report")?;
    if matches!(cli.format, Format::Collapsed | Format::Flamegraph) {
        // These formats have no place for them: the counters go to stderr.
        let mut err = std::io::stderr().lock();
        report::write_losses(&profile.losses, &mut err)?;
    }
    Ok(())
}

/// `--verbose`: what user space spent, for tuning and `cargo xtask bench`.
fn print_stats(collector: &Collector) {
    let u = collector.state.unwinders.stats;
    if u.stacks > 0 {
        let secs = u.nanos as f64 / 1e9;
        eprintln!(
            "memtrace-bpf: unwound {} stacks ({} frames, {} truncated) in {:.1} ms: {:.0} stacks/s",
            u.stacks,
            u.frames,
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

/// A pidfd: readable once the process has exited.
struct PidFd {
    fd: OwnedFd,
}

impl PidFd {
    fn open(pid: u32) -> Result<PidFd, TraceError> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
        if fd < 0 {
            return Err(TraceError::NoSuchProcess(pid));
        }
        // SAFETY: fd is a fresh descriptor that we own from here on.
        Ok(PidFd {
            fd: unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) },
        })
    }

    fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLIN != 0
    }
}
