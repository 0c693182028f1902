//! The trace's loop: drains events until what ends the phase happens, and
//! meanwhile hooks new processes, follows execs and forks, and records the
//! heap's history (--interval, --serve) with its numbered snapshots.

use std::{
    os::fd::{AsRawFd, RawFd},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use super::{
    end_reason::{EndReason, EndSignal},
    Trace,
};

/// How often the ring buffer is drained (BPF submits without wakeups).
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);
/// How often --binary looks for new processes running the program.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long one turn of the trace's loop may spend on execs, and the end
/// of the trace on those left (see `handle_execs`).
const EXEC_BUDGET: Duration = Duration::from_millis(20);
pub const FINAL_EXEC_BUDGET: Duration = Duration::from_millis(200);
/// How long calls already inside the allocator get to return after the stop.
pub const STOP_GRACE: Duration = Duration::from_millis(20);
/// How long a started command gets to exit after the trace ended first and
/// it was sent SIGTERM (or SIGINT, SIGHUP), before SIGKILL.
pub const COMMAND_GRACE: Duration = Duration::from_secs(5);

/// What ends a collection phase.
#[derive(Clone, Copy)]
pub enum Phase {
    /// The trace: the duration, the target's exit, SIGINT, SIGTERM or SIGHUP.
    Trace { duration: Option<f64> },
    /// A started command was told to stop: its exit; SIGKILL when the grace
    /// time is over or another SIGINT/SIGTERM/SIGHUP comes.
    WindDown,
}

/// The signals a trace reacts to, installed before anything is attached.
pub struct Signals {
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    /// The terminal or SSH session closed: ends the trace as SIGTERM does
    /// (its default action would end the tracer with no report).
    sighup: tokio::signal::unix::Signal,
    sigchld: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Signals> {
        Ok(Signals {
            sigint: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
            sigterm: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            sighup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
            sigchld: signal(SignalKind::child()).context("installing SIGCHLD handler")?,
        })
    }

    /// Waits for SIGINT, SIGTERM or SIGHUP; returns its number.
    pub async fn interrupt(&mut self) -> i32 {
        tokio::select! {
            _ = self.sigint.recv() => libc::SIGINT,
            _ = self.sigterm.recv() => libc::SIGTERM,
            _ = self.sighup.recv() => libc::SIGHUP,
        }
    }
}

/// What a signal or the deadline means in a phase.
enum Next {
    Continue,
    End(EndReason),
}

/// The loop's periodic wake-ups.
struct Ticks {
    /// --binary's look for new processes (`POLL_INTERVAL`).
    poll: tokio::time::Interval,
    /// The ring buffer's drain (`DRAIN_INTERVAL`).
    tick: tokio::time::Interval,
    /// --verbose: a stats line every STATS_INTERVAL (not at the start).
    stats_tick: tokio::time::Interval,
    /// The progress line.
    progress_tick: tokio::time::Interval,
    /// The processes offered to the memory watcher, at once and then every
    /// `MEMORY_INTERVAL`.
    memory_tick: tokio::time::Interval,
}

impl Ticks {
    fn start(now: tokio::time::Instant) -> Ticks {
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut tick = tokio::time::interval(DRAIN_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut stats_tick = tokio::time::interval_at(
            now + super::stats::STATS_INTERVAL,
            super::stats::STATS_INTERVAL,
        );
        stats_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut progress_tick = tokio::time::interval(super::progress::PROGRESS_INTERVAL);
        progress_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut memory_tick = tokio::time::interval(super::memory_watch::MEMORY_INTERVAL);
        memory_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        Ticks {
            poll,
            tick,
            stats_tick,
            progress_tick,
            memory_tick,
        }
    }
}

/// Why the phase ended when the target exited (`killed`: why the command
/// was killed, in the wind-down).
fn exit_reason(phase: Phase, killed: Option<String>) -> EndReason {
    match (phase, killed) {
        (Phase::Trace { .. }, _) => EndReason::TargetExited,
        (Phase::WindDown, Some(why)) => EndReason::CommandKilled(why),
        (Phase::WindDown, None) => EndReason::CommandExited,
    }
}

impl Trace<'_> {
    /// Drains events until the phase ends (see `Phase`). Returns why it ended.
    pub async fn collect(&mut self, phase: Phase) -> anyhow::Result<EndReason> {
        let (exit, events) = self.watch()?;
        let now = tokio::time::Instant::now();
        let mut ticks = Ticks::start(now);
        let mut deadline = match phase {
            Phase::Trace { duration } => duration.map(|d| now + Duration::from_secs_f64(d)),
            Phase::WindDown => Some(now + COMMAND_GRACE),
        };
        // Why the command was killed, in the wind-down.
        let mut killed: Option<String> = None;
        let verbose = self.settings.config.verbose;
        // Dropped (the line cleared) however the loop ends.
        let mut progress = super::progress::Progress::new(self.settings.config.quiet, self.started);
        loop {
            let snapshot_due = self.next_snapshot();
            let next = tokio::select! {
                _ = self.signals.sigint.recv() => {
                    self.on_signal(phase, EndSignal::Int, &mut killed, &mut deadline)
                }
                _ = self.signals.sigterm.recv() => {
                    self.on_signal(phase, EndSignal::Term, &mut killed, &mut deadline)
                }
                _ = self.signals.sighup.recv() => {
                    self.on_signal(phase, EndSignal::Hup, &mut killed, &mut deadline)
                }
                _ = exited(exit.as_ref()) => Next::End(exit_reason(phase, killed.take())),
                _ = sleep_until(deadline) => match phase {
                    Phase::Trace { .. } => Next::End(EndReason::DurationElapsed),
                    Phase::WindDown => {
                        killed = Some(format!(
                            "when it had not exited within {} s",
                            COMMAND_GRACE.as_secs()
                        ));
                        self.kill_command(&mut deadline);
                        Next::Continue
                    }
                },
                _ = ticks.poll.tick() => {
                    self.poll_scope();
                    Next::Continue
                }
                _ = self.signals.sigchld.recv() => {
                    self.service_child();
                    Next::Continue
                }
                _ = sleep_until(snapshot_due) => {
                    self.collector.drain_all();
                    self.history_tick();
                    Next::Continue
                }
                reply = next_request(self.serve.as_mut()) => {
                    self.answer_snapshot(reply);
                    Next::Continue
                }
                _ = ticks.tick.tick() => {
                    self.collector.drain();
                    Next::Continue
                }
                _ = ticks.progress_tick.tick(), if progress.enabled() => {
                    self.show_progress(&mut progress);
                    Next::Continue
                }
                _ = ticks.memory_tick.tick() => {
                    self.offer_memory();
                    Next::Continue
                }
                _ = ticks.stats_tick.tick(), if verbose => {
                    self.print_stats();
                    Next::Continue
                }
                guard = events.readable() => {
                    self.collector.drain();
                    if let Ok(mut guard) = guard {
                        guard.clear_ready();
                    }
                    Next::Continue
                }
            };
            if let Next::End(why) = next {
                return Ok(why);
            }
            self.scope
                .on_process_changes(self.collector.take_process_changes());
            self.handle_execs(EXEC_BUDGET);
            self.peak_snapshot();
        }
    }

    /// --verbose's periodic line, and the OTLP pushes' when pushing.
    fn print_stats(&mut self) {
        self.stats.print(
            self.collector.stats(),
            self.collector.live_map_entries(),
            self.collector.tables_in_use(),
        );
        if let Some(push) = &self.otlp {
            push.say_stats();
        }
    }

    /// The processes whose memory the watcher may read (it reads on its
    /// own thread).
    fn offer_memory(&mut self) {
        let seen = self
            .collector
            .processes()
            .running_pids(super::memory_watch::MAX_WATCHED);
        self.memory.offer(seen);
    }

    /// The scope's look for new processes (--binary), whose maps are read.
    fn poll_scope(&mut self) {
        for pid in self.scope.poll(&mut self.loaded, &mut self.hooks) {
            self.collector.refresh_maps(pid);
        }
    }

    /// The fds the loop waits on: the target's pidfd (readable at its exit,
    /// --pid and -- CMD) and the reader's eventfd (events queued).
    fn watch(&self) -> anyhow::Result<(Option<AsyncFd<RawFd>>, AsyncFd<RawFd>)> {
        let exit = match self.scope.exit_fd().map(|pidfd| pidfd.fd.as_raw_fd()) {
            // SAFETY: the scope owns the pidfd for the whole trace, and
            // `collect`, the only caller, drops the AsyncFd before it
            // returns, while it still borrows the trace: the raw fd stays
            // open while the AsyncFd exists.
            Some(fd) => Some(
                unsafe { AsyncFd::register(fd) }
                    .map_err(|e| anyhow::anyhow!("watching the target for exit: {e}"))?,
            ),
            None => None,
        };
        // SAFETY: the collector owns the reader's eventfd for the whole
        // trace, and `collect` drops the AsyncFd before it returns: the fd
        // stays open while the AsyncFd exists.
        let events = unsafe {
            AsyncFd::register_with_interest(self.collector.events_fd(), Interest::READABLE)
        }
        .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
        Ok((exit, events))
    }

    /// SIGINT, SIGTERM or SIGHUP ends the trace; in the wind-down, a second
    /// one stops waiting for the command.
    fn on_signal(
        &mut self,
        phase: Phase,
        signal: EndSignal,
        killed: &mut Option<String>,
        deadline: &mut Option<tokio::time::Instant>,
    ) -> Next {
        match phase {
            Phase::Trace { .. } => Next::End(EndReason::Signal(signal)),
            Phase::WindDown => {
                *killed = Some(format!("on a second {}", signal.name()));
                self.kill_command(deadline);
                Next::Continue
            }
        }
    }

    /// When the next history tick is due (None without --interval or
    /// --serve). Deadlines are absolute: a late tick does not shift the
    /// later ones.
    fn next_snapshot(&self) -> Option<tokio::time::Instant> {
        let every = self.settings.tick?;
        let due = every * (self.snapshots + 1);
        Some(tokio::time::Instant::from_std(self.started + due))
    }

    /// A started command's ptrace stops: its last events are drained at
    /// its exit; at an exec, what the new image will load is hooked before
    /// it runs (in a chroot or another mount namespace these are other
    /// files than the host's).
    /// With `--unwind tables` it stays held until its new maps (and the
    /// tables of the allocator libraries it will map) are in the kernel,
    /// and stops again at its entry point, where the libraries the loader
    /// mapped are described before `main` runs.
    pub fn service_child(&mut self) {
        let attach_only = !self.scope.follows_forks();
        let collector = std::cell::RefCell::new(&mut self.collector);
        let (loaded, hooks) = (&mut self.loaded, &mut self.hooks);
        self.scope.service_child(
            |pid| collector.borrow_mut().drain_exiting(pid),
            |pid| {
                let program = crate::tracee::search::Program::just_executed(pid);
                hooks.hook_running(loaded, pid, program, attach_only.then_some(pid));
                let libraries = hooks.hooked_objects().map(|h| h.host_path.as_path());
                collector.borrow_mut().describe_at_exec(pid, libraries)
            },
            |pid| collector.borrow_mut().describe_at_entry(pid),
        );
    }

    /// Handles the execs seen so far, oldest first, for at most `budget`.
    /// Reading a new image's objects takes milliseconds; on a host that
    /// starts hundreds of programs a second it must not keep the loop from
    /// draining events, or from ending the trace: the rest wait for the next
    /// turn.
    pub fn handle_execs(&mut self, budget: Duration) {
        let start = Instant::now();
        while start.elapsed() < budget {
            let Some(exec) = self.collector.next_exec() else {
                break;
            };
            let pid = exec.pid;
            // Gone already: nothing left to read, and no failure to hook.
            if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok()
                && self.scope.on_exec(exec, &mut self.loaded, &mut self.hooks)
            {
                self.collector.refresh_maps(pid);
            }
        }
    }

    /// --serve: builds the snapshot the server asked for, with every event
    /// queued so far, and hands it back (the server renders it).
    fn answer_snapshot(&mut self, reply: crate::serve::SnapshotReply) {
        if reply.is_closed() {
            return; // the client gave up
        }
        self.collector.drain_all();
        // Every event before this moment has been read: a delta window
        // that opens with this snapshot opens here.
        let taken_ns = crate::collect::monotonic_ns();
        // The query's own min age (0: every block), else the trace's.
        let min_age = match reply.min_age {
            Some(secs) => super::config::min_age(Some(secs)),
            None => self.settings.config.min_age,
        };
        let in_use = crate::collect::InUseFilter {
            min_age,
            born_since_ns: reply.born_since_ns,
        };
        let profile = self.snapshot_filtered(
            &EndReason::Snapshot("snapshot served while tracing (the trace went on)".into()),
            in_use,
        );
        let _ = reply.send(crate::serve::Snapshot {
            profile: std::sync::Arc::new(profile),
            stats: self.collector.stats(),
            taken_ns,
        });
    }

    /// SIGKILL to a started command still running; no more deadline.
    fn kill_command(&mut self, deadline: &mut Option<tokio::time::Instant>) {
        if let Some(command) = self.scope.running_command() {
            command.signal(libc::SIGKILL);
        }
        *deadline = None;
    }
}

async fn exited(exit: Option<&AsyncFd<RawFd>>) {
    match exit {
        Some(fd) => {
            let _ = fd.readable().await;
        }
        None => std::future::pending().await,
    }
}

/// The server's next snapshot request; never, without --serve.
async fn next_request(
    requests: Option<&mut crate::serve::SnapshotRequests>,
) -> crate::serve::SnapshotReply {
    match requests {
        Some(requests) => requests.next().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
