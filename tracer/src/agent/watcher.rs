//! The triggers at work, on a thread of their own: every `ROUND` each
//! trigger's memory is read (a cgroup's `memory.current` or v1
//! `memory.usage_in_bytes`, its `memory.events` or v1 `memory.failcnt` and
//! `memory.oom_control`'s `oom_kill`; a
//! process's RSS), and PSI triggers are the kernel's own (written to the
//! pressure file, waited on with poll: no polling of the numbers). A
//! trigger that holds starts a trace of its cgroup or process unless one
//! of its traces runs, its cooldown has not passed or the agent runs
//! `--max-traces` already; the trace ends at its `seconds`, or once the
//! condition has not held for `CALM` (the growth stopped). Its final
//! profile goes to the reports directory (reports.rs).

use std::{
    io::Write as _,
    os::fd::{AsRawFd as _, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use super::{
    api::Agent,
    jobs::State as JobState,
    reports::Reports,
    request::{Target, TraceRequest},
    triggers::{Condition, Readings, Trigger, TriggerState, TriggerTarget},
};
use crate::tracee::memory::{self, CgroupMemoryFiles};

/// How often the triggers' numbers are read: a spike of 100 MiB/s is seen
/// within 25 MiB of its threshold. A read is one small file of the kernel
/// a trigger (0.02 ms).
const ROUND: Duration = Duration::from_millis(250);
/// A triggered trace ends once its condition has not held this long.
const CALM: Duration = Duration::from_secs(10);
/// Its shortest run, whatever the condition does.
const MIN_TRACE: Duration = Duration::from_secs(5);

struct Watched {
    state: TriggerState,
    readings: Readings,
    /// Where its cgroup's numbers are read.
    files: Option<CgroupMemoryFiles>,
    /// Its PSI trigger, registered with the kernel.
    psi: Option<OwnedFd>,
    last_fired: Option<Instant>,
    /// When its condition last held.
    last_held: Option<Instant>,
    trace_started: Option<Instant>,
}

/// What stops the thread.
pub struct Watcher {
    stop: AtomicBool,
}

impl Watcher {
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Starts the thread, which keeps the triggers' states in `agent` (GET
/// /triggers); what stops it, and the thread.
pub fn start(
    triggers: Vec<Trigger>,
    agent: Arc<Agent>,
    reports: Reports,
) -> std::io::Result<(Arc<Watcher>, std::thread::JoinHandle<()>)> {
    let mut watched: Vec<Watched> = triggers.into_iter().map(arm).collect();
    agent.set_triggers(watched.iter().map(|w| w.state.clone()).collect());
    let watcher = Arc::new(Watcher {
        stop: AtomicBool::new(false),
    });
    let shared = watcher.clone();
    let thread = std::thread::Builder::new()
        .name("memtrace-triggers".into())
        .spawn(move || {
            let mut reports = reports;
            let started = Instant::now();
            let mut last_sweep = started;
            while !shared.stop.load(Ordering::Relaxed) {
                let pressured = wait_pressure(&watched, ROUND);
                let secs = started.elapsed().as_secs_f64();
                // The traces that ended, for every trigger: once a second
                // (a sweep reads the traces' directory for each trace).
                if last_sweep.elapsed() >= Duration::from_secs(1) {
                    agent.jobs().sweep();
                    last_sweep = Instant::now();
                }
                for (i, w) in watched.iter_mut().enumerate() {
                    let holds = pressured.contains(&i) || evaluate(w, secs);
                    w.state.holds = holds;
                    if holds {
                        w.last_held = Some(Instant::now());
                        fire(w, &agent);
                    }
                    follow(w, &agent, &mut reports);
                }
                agent.set_triggers(watched.iter().map(|w| w.state.clone()).collect());
            }
            // The agent stops: the traces were ended (api stop_all); their
            // reports are saved.
            agent.jobs().sweep();
            for w in &mut watched {
                w.last_held = None;
                follow(w, &agent, &mut reports);
            }
        })?;
    Ok((watcher, thread))
}

/// A trigger made ready: its files found, its PSI trigger registered.
fn arm(trigger: Trigger) -> Watched {
    let mut error = None;
    let files = match &trigger.target {
        TriggerTarget::Cgroup(path) => match crate::tracee::cgroup::resolve(path) {
            Ok(c) => {
                let member = c.processes().first().copied();
                let files = CgroupMemoryFiles::find(&c.dir, &c.path, member);
                if files.is_none() {
                    error = Some("no memory controller to read for this cgroup".into());
                }
                files
            }
            Err(e) => {
                error = Some(format!("{e:#}"));
                None
            }
        },
        TriggerTarget::Pid(_) => None,
    };
    let psi = match trigger.condition {
        Condition::Pressure {
            full,
            stall,
            window,
        } => match register_psi(&trigger.target, full, stall, window) {
            Ok(fd) => Some(fd),
            Err(e) => {
                error = Some(e);
                None
            }
        },
        _ => None,
    };
    Watched {
        state: TriggerState {
            trigger,
            last_value: None,
            holds: false,
            fired: 0,
            skipped_busy: 0,
            running_trace: None,
            last_report: None,
            error,
        },
        readings: Readings::default(),
        files,
        psi,
        last_fired: None,
        last_held: None,
        trace_started: None,
    }
}

/// A PSI trigger: "some|full STALL_US WINDOW_US" written to the cgroup's
/// memory.pressure (cgroup v2), else /proc/pressure/memory; the kernel
/// makes the fd readable with POLLPRI when it holds.
fn register_psi(
    target: &TriggerTarget,
    full: bool,
    stall: Duration,
    window: Duration,
) -> Result<OwnedFd, String> {
    let path = match target {
        TriggerTarget::Cgroup(path) => crate::tracee::cgroup::resolve(path)
            .ok()
            .map(|c| c.dir.join("memory.pressure"))
            .filter(|p| p.exists())
            .unwrap_or_else(|| "/proc/pressure/memory".into()),
        TriggerTarget::Pid(_) => "/proc/pressure/memory".into(),
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| {
            format!(
                "{}: {e} (is PSI on? psi=1 on the kernel's command line)",
                path.display()
            )
        })?;
    let line = format!(
        "{} {} {}\0",
        if full { "full" } else { "some" },
        stall.as_micros(),
        window.as_micros()
    );
    file.write_all(line.as_bytes()).map_err(|e| {
        let hint = match window.as_millis() % 2000 {
            0 => "",
            // The kernel's rule for triggers of tasks without CAP_SYS_RESOURCE.
            _ => " (without CAP_SYS_RESOURCE the kernel takes windows of whole multiples of 2s)",
        };
        format!(
            "{}: the kernel refused the trigger: {e}{hint}",
            path.display()
        )
    })?;
    Ok(file.into())
}

/// Waits up to `timeout` for PSI triggers; the indices of those that fired.
fn wait_pressure(watched: &[Watched], timeout: Duration) -> Vec<usize> {
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut which = Vec::new();
    for (i, w) in watched.iter().enumerate() {
        if let Some(fd) = &w.psi {
            fds.push(libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            });
            which.push(i);
        }
    }
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(1000);
    if fds.is_empty() {
        std::thread::sleep(timeout);
        return Vec::new();
    }
    // SAFETY: `fds` is a valid array of pollfd of the length given; the
    // fds stay open (owned by `watched`) for the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return Vec::new();
    }
    fds.iter()
        .zip(which)
        .filter(|(p, _)| p.revents & libc::POLLPRI != 0)
        .map(|(_, i)| i)
        .collect()
}

/// Reads the trigger's value; whether its condition holds.
fn evaluate(w: &mut Watched, secs: f64) -> bool {
    let condition = w.state.trigger.condition;
    let value = match (&w.state.trigger.target, condition) {
        (_, Condition::Pressure { .. }) => return false,
        (TriggerTarget::Cgroup(_), Condition::Events) => w.files.as_ref().and_then(events),
        (TriggerTarget::Cgroup(_), _) => {
            w.files.as_ref().and_then(|f| f.read()).map(|m| m.resident)
        }
        (TriggerTarget::Pid(pid), _) => memory::of_process(*pid).map(|m| m.resident),
    };
    w.state.last_value = value;
    value.is_some_and(|v| w.readings.add(&condition, secs, v))
}

/// The cgroup's "about to be OOM" counters: v2 memory.events `high` +
/// `max`, v1 `memory.failcnt` + `memory.oom_control`'s `oom_kill`.
fn events(files: &CgroupMemoryFiles) -> Option<u64> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    match files {
        CgroupMemoryFiles::V2(dir) => {
            let text = read(dir.join("memory.events"))?;
            let count = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
                    .unwrap_or(0)
            };
            Some(count("high ") + count("max "))
        }
        CgroupMemoryFiles::V1(dir) => v1_events(
            &read(dir.join("memory.failcnt"))?,
            read(dir.join("memory.oom_control")).as_deref(),
        ),
    }
}

/// Starts a trace of the trigger's target, unless one runs, it is in its
/// cooldown, or the agent is at --max-traces.
fn fire(w: &mut Watched, agent: &Agent) {
    let t = &w.state.trigger;
    let cooling = w.last_fired.is_some_and(|at| at.elapsed() < t.cooldown);
    if w.state.running_trace.is_some() || cooling {
        return;
    }
    let target = match &t.target {
        TriggerTarget::Cgroup(path) => Target::Cgroup(path.clone()),
        TriggerTarget::Pid(pid) => Target::Pid(*pid),
    };
    let request = TraceRequest {
        target,
        seconds: t.seconds,
        sample_rate: t.sample_rate,
        interval: t.seconds.min(5.0),
        min_age: None,
        otlp: agent.otlp.clone(),
    };
    match agent.jobs().start(request) {
        Ok(id) => {
            w.state.fired += 1;
            w.state.running_trace = Some(id);
            w.last_fired = Some(Instant::now());
            w.trace_started = Some(Instant::now());
            crate::console::say(format_args!(
                "trigger \"{}\" holds: trace {id} started",
                crate::escape::text(&w.state.trigger.line)
            ));
        }
        Err(_) => w.state.skipped_busy += 1,
    }
}

/// A triggered trace: ended once the condition has been calm, saved to
/// the reports once finished.
fn follow(w: &mut Watched, agent: &Agent, reports: &mut Reports) {
    let Some(id) = w.state.running_trace else {
        return;
    };
    let mut jobs = agent.jobs();
    let state = jobs.get(id).map(|j| j.state.clone());
    match state {
        Some(JobState::Running) => {
            let ran = w.trace_started.map_or(Duration::ZERO, |s| s.elapsed());
            let calm = w.last_held.is_none_or(|at| at.elapsed() >= CALM);
            let pressure = matches!(w.state.trigger.condition, Condition::Pressure { .. });
            if ran >= MIN_TRACE && calm && !pressure {
                jobs.cancel(id);
            }
        }
        Some(JobState::Done) => {
            let path = jobs.profile_path(id);
            drop(jobs);
            w.state.running_trace = None;
            if let Some(path) = path {
                match reports.save(&path, &w.state.trigger) {
                    Ok(name) => {
                        crate::console::say(format_args!(
                            "trace {id}: report {}",
                            crate::escape::text(&name)
                        ));
                        w.state.last_report = Some(name);
                    }
                    Err(e) => crate::console::warn(format_args!(
                        "trace {id}: report not saved: {}",
                        crate::escape::text(&format!("{e:#}"))
                    )),
                }
            }
        }
        Some(JobState::Failed) | None => {
            let why = jobs.get(id).and_then(|j| jobs.status(j).error);
            w.state.running_trace = None;
            w.state.error = why.map(|e| format!("trace {id} failed: {e}"));
        }
    }
}

/// v1: `memory.failcnt` plus `memory.oom_control`'s `oom_kill` (4.13+; the
/// kills failcnt does not count where reclaim met the limit until then).
fn v1_events(failcnt: &str, oom_control: Option<&str>) -> Option<u64> {
    let failcnt: u64 = failcnt.trim().parse().ok()?;
    let killed = oom_control.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse::<u64>().ok())
    });
    Some(failcnt + killed.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn v1_events_count_failures_and_oom_kills() {
        let control = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(super::v1_events("5\n", Some(control)), Some(7));
        assert_eq!(super::v1_events("5\n", None), Some(5));
        assert_eq!(super::v1_events("x", Some(control)), None);
    }
}
