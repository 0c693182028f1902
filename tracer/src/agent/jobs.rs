//! The agent's traces: each one a tracer process of its own (this same
//! binary, with the request's command line), writing its profile so far
//! as numbered JSON snapshots into the agent's directory and its final
//! profile last. Separate processes keep every trace's numbers its own:
//! two traces never share a sample rate, a filter or a live map.
//!
//! A trace is given to the standby tracer (spare.rs) when one is ready,
//! and starts without waiting for the verifier.
//!
//! Bounded: at most `max_running` traces run at once (a request beyond is
//! refused), the last `MAX_FINISHED` finished ones are kept with their
//! final profile (older ones are removed, files and all), and of a running
//! trace only its newest snapshot is kept on disk.

use std::{
    collections::BTreeMap,
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Instant, SystemTime},
};

use serde::Serialize;

use super::{
    log_tail::tail_of,
    request::TraceRequest,
    spare::Spares,
    trace_files::{newest_snapshot, prune_snapshots, remove_files, remove_left_over, said_tracing},
};

/// Finished traces kept, with their profiles.
pub const MAX_FINISHED: usize = 32;
/// How long a trace may take to attach its probes before the next
/// standby tracer is started anyway.
const STARTING: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Running,
    Done,
    Failed,
}

pub struct Job {
    pub id: u64,
    pub request: TraceRequest,
    started: Instant,
    started_unix_secs: u64,
    child: Option<Child>,
    pub state: State,
    /// Why it failed: the end of the tracer's stderr, escaped.
    error: Option<String>,
    /// DELETE ended it before its time.
    ended_early: bool,
    ended: Option<Instant>,
    /// Run by the standby tracer, with programs loaded ahead.
    loaded_ahead: bool,
    /// The processes its target had when it started (see `covered`).
    processes: usize,
}

/// A trace as `GET /traces` lists it.
#[derive(Serialize)]
pub struct Status {
    pub id: u64,
    pub target: String,
    pub seconds: f64,
    pub sample_rate: u64,
    pub interval: f64,
    pub min_age: Option<f64>,
    pub state: State,
    pub error: Option<String>,
    pub ended_early: bool,
    pub started_unix_secs: u64,
    /// Seconds it has run (or ran).
    pub elapsed_secs: f64,
    /// Its probes are attached: the tracer said it is tracing.
    pub attached: bool,
    /// Whether a profile can be had (`?format=`): a snapshot was written.
    pub profile: bool,
    /// Its programs were loaded ahead of the request (the standby tracer).
    pub loaded_ahead: bool,
}

pub enum StartError {
    /// `max_running` traces run already.
    Busy(usize),
    /// The trace would cover `asked` processes, the running ones cover
    /// `covered`, and together they may cover `max`.
    TooManyProcesses {
        asked: usize,
        covered: usize,
        max: usize,
    },
    Spawn(String),
}

pub struct Jobs {
    dir: PathBuf,
    exe: PathBuf,
    max_running: usize,
    /// The most processes the running traces may cover together.
    max_processes: usize,
    next_id: u64,
    jobs: BTreeMap<u64, Job>,
    spares: Spares,
}

impl Jobs {
    /// Traces run `exe` and write into `dir` (made already, root's only).
    /// Files an earlier agent's traces left there are removed: ids start
    /// at 1 again, and trace 1's profile must be this trace 1's.
    pub fn new(dir: PathBuf, exe: PathBuf, max_running: usize, max_processes: usize) -> Jobs {
        remove_left_over(&dir);
        let mut spares = Spares::new(exe.clone(), dir.clone());
        spares.refill();
        Jobs {
            dir,
            exe,
            max_running,
            max_processes,
            next_id: 1,
            jobs: BTreeMap::new(),
            spares,
        }
    }

    /// The processes the running traces' targets had when they started:
    /// a cgroup's, or one for a pid or a program (whose processes the
    /// tracer bounds itself).
    pub fn covered(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.state == State::Running)
            .map(|j| j.processes)
            .sum()
    }

    pub fn running(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.state == State::Running)
            .count()
    }

    /// Starts a trace; its id.
    pub fn start(&mut self, request: TraceRequest) -> Result<u64, StartError> {
        // Not `sweep`: a standby tracer started now would verify while
        // this trace's own tracer starts.
        self.reap();
        if self.running() >= self.max_running {
            return Err(StartError::Busy(self.max_running));
        }
        let asked = request.target.processes();
        let covered = self.covered();
        if covered + asked > self.max_processes {
            return Err(StartError::TooManyProcesses {
                asked,
                covered,
                max: self.max_processes,
            });
        }
        let id = self.next_id;
        let args = request.tracer_args(&self.dir.join(format!("{id}-{{n}}.json")));
        let (child, loaded_ahead) = match self.spares.take(&args, &self.stderr_path(id)) {
            Some(child) => (child, true),
            None => (self.spawn(id, &args)?, false),
        };
        self.next_id += 1;
        self.jobs.insert(
            id,
            Job {
                id,
                request,
                started: Instant::now(),
                started_unix_secs: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                child: Some(child),
                state: State::Running,
                error: None,
                ended_early: false,
                ended: None,
                loaded_ahead,
                processes: asked,
            },
        );
        Ok(id)
    }

    /// A tracer of its own for trace `id`.
    fn spawn(&self, id: u64, args: &[std::ffi::OsString]) -> Result<Child, StartError> {
        let stderr = fs::File::create(self.stderr_path(id))
            .map_err(|e| StartError::Spawn(format!("creating the trace's log: {e}")))?;
        let mut command = Command::new(&self.exe);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        super::child::ends_with_the_agent(&mut command);
        command
            .spawn()
            .map_err(|e| StartError::Spawn(format!("starting {}: {e}", self.exe.display())))
    }

    /// Ends a running trace now: SIGINT, as Ctrl-C would; it writes its
    /// final profile. False when there is no such trace.
    pub fn cancel(&mut self, id: u64) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        if let Some(child) = &job.child {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill has no memory effects; the child is ours and
                // not reaped yet (its Child is held), so the pid is its.
                unsafe { libc::kill(pid, libc::SIGINT) };
                job.ended_early = true;
            }
        }
        true
    }

    /// Reaps the traces that ended, keeps only each running trace's newest
    /// snapshot, removes the oldest finished beyond `MAX_FINISHED`, and
    /// starts the next standby tracer when it is time.
    pub fn sweep(&mut self) {
        self.reap();
        // The next standby tracer's verification waits until the traces
        // started are attached: it would compete with them for the CPU.
        let starting = self.jobs.values().any(|j| {
            j.state == State::Running
                && j.started.elapsed() < STARTING
                && !said_tracing(&self.stderr_path(j.id))
        });
        if !starting {
            self.spares.refill();
        }
    }

    /// `sweep` without the standby tracer.
    fn reap(&mut self) {
        for job in self.jobs.values_mut() {
            let Some(child) = job.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    job.child = None;
                    job.ended = Some(Instant::now());
                    let written = newest_snapshot(&self.dir, job.id).is_some();
                    if status.success() && written {
                        job.state = State::Done;
                    } else {
                        job.state = State::Failed;
                        job.error = Some(tail_of(&self.dir.join(format!("{}.stderr", job.id))));
                    }
                }
                Err(e) => {
                    job.child = None;
                    job.state = State::Failed;
                    job.error = Some(format!("waiting for the tracer: {e}"));
                }
            }
            prune_snapshots(&self.dir, job.id);
        }
        let finished: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| j.state != State::Running)
            .map(|j| j.id)
            .collect();
        for id in finished
            .iter()
            .take(finished.len().saturating_sub(MAX_FINISHED))
        {
            self.jobs.remove(id);
            remove_files(&self.dir, *id);
        }
    }

    pub fn get(&self, id: u64) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// The standby tracer's state (spare.rs) and pid.
    pub fn standby(&self) -> (String, Option<u32>) {
        (self.spares.state(), self.spares.pid())
    }

    pub fn statuses(&self) -> Vec<Status> {
        self.jobs.values().map(|j| self.status(j)).collect()
    }

    pub fn status(&self, job: &Job) -> Status {
        let r = &job.request;
        Status {
            id: job.id,
            target: r.label(),
            seconds: r.seconds,
            sample_rate: r.sample_rate,
            interval: r.interval,
            min_age: r.min_age,
            state: job.state.clone(),
            error: job.error.clone(),
            ended_early: job.ended_early,
            started_unix_secs: job.started_unix_secs,
            elapsed_secs: job
                .ended
                .unwrap_or_else(Instant::now)
                .duration_since(job.started)
                .as_secs_f64(),
            attached: said_tracing(&self.stderr_path(job.id)),
            profile: newest_snapshot(&self.dir, job.id).is_some(),
            loaded_ahead: job.loaded_ahead,
        }
    }

    /// The trace's newest profile: its final one once it ended.
    pub fn profile_path(&self, id: u64) -> Option<PathBuf> {
        newest_snapshot(&self.dir, id).map(|(_, path)| path)
    }

    /// The agent stops: every running trace ends and writes its profile
    /// (waited for up to `grace`, then killed).
    pub fn stop_all(&mut self, grace: std::time::Duration) {
        self.spares.stop();
        let ids: Vec<u64> = self.jobs.keys().copied().collect();
        for id in ids {
            self.cancel(id);
        }
        let deadline = Instant::now() + grace;
        while self.running() > 0 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            self.reap();
        }
        for job in self.jobs.values_mut() {
            if let Some(child) = job.child.as_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    fn stderr_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{id}.stderr"))
    }
}
