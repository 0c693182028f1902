//! The agent's HTTP API (docs/agent.md): traces started, listed, read and
//! ended on request, and Go's on-demand heap profile. Every request is
//! bounded (a 4 KiB body, the limits of `request.rs`, `max_running` traces)
//! and a bad one gets a 4xx that says what to send, and starts nothing.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, Path, Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};

use super::{
    jobs::{Jobs, StartError, State as JobState},
    request::{Target, TraceRequest},
};
use crate::report::{Format, View};

/// Largest request body.
pub const MAX_BODY: usize = 4096;

pub const ENDPOINTS: &str = "\
POST   /traces                 start a trace: JSON {pid|binary|cgroup, seconds, sample_rate, interval, min_age} -> {id, ...}
GET    /traces                 every trace kept, with its state
GET    /traces/ID              one trace's state
GET    /traces/ID?format=F     its profile so far, or its final one: pprof, json, collapsed, flamegraph, speedscope, text
DELETE /traces/ID              end it now (its final profile is written)
GET    /triggers               the triggers (--trigger, --triggers FILE), each with its last reading and traces
GET    /debug/pprof/heap?pid=N&seconds=S[&sample_rate=B]    trace for S seconds (1 to 300), then pprof, in-use space first (also binary=, cgroup=)
GET    /debug/pprof/allocs?...                               the same, allocated space first
";

pub struct Agent {
    pub jobs: Mutex<Jobs>,
    /// The triggers' states, as the triggers' thread last saw them.
    pub triggers: Mutex<Vec<super::triggers::TriggerState>>,
    /// --otlp: where triggered traces push their profiles.
    pub otlp: Option<String>,
}

impl Agent {
    pub fn jobs(&self) -> std::sync::MutexGuard<'_, Jobs> {
        self.jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_triggers(&self, states: Vec<super::triggers::TriggerState>) {
        *self
            .triggers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = states;
    }
}

pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/traces", get(list).post(start))
        .route("/traces/{id}", get(one).delete(end))
        .route("/triggers", get(triggers))
        .route("/debug/pprof/heap", get(heap))
        .route("/debug/pprof/allocs", get(allocs))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(agent)
}

/// A request refused: its status and what to do.
pub struct Refused(StatusCode, String);

impl Refused {
    fn new(status: StatusCode, why: impl Into<String>) -> Refused {
        Refused(status, why.into())
    }
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, &self.1)
    }
}

fn error(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{why}\n"),
    )
        .into_response()
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    match serde_json::to_vec_pretty(value) {
        Ok(mut body) => {
            body.push(b'\n');
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn index() -> Response {
    error(StatusCode::OK, &format!("memtrace-bpf agent\n{ENDPOINTS}"))
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no such endpoint; the agent serves:\n{ENDPOINTS}"),
    )
}

async fn list(State(agent): State<Arc<Agent>>) -> Response {
    let mut jobs = agent.jobs();
    jobs.sweep();
    let (standby, standby_pid) = jobs.standby();
    json(
        StatusCode::OK,
        &serde_json::json!({
            "traces": jobs.statuses(),
            "standby": standby,
            "standby_pid": standby_pid,
        }),
    )
}

async fn triggers(State(agent): State<Arc<Agent>>) -> Response {
    let states = agent
        .triggers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    json(StatusCode::OK, &serde_json::json!({ "triggers": states }))
}

/// What the agent checks itself before starting a tracer: the pid is a
/// process, the program a file. (The tracer says what else is wrong.)
fn precheck(request: &TraceRequest) -> Result<(), String> {
    match &request.target {
        Target::Pid(pid) if !std::path::Path::new(&format!("/proc/{pid}")).exists() => {
            Err(format!("no process has pid {pid}"))
        }
        Target::Binary(path) if !path.is_file() => Err(format!(
            "binary {}: no such file (give the program's absolute path)",
            crate::escape::path(path)
        )),
        _ => Ok(()),
    }
}

fn start_job(agent: &Agent, request: TraceRequest) -> Result<u64, Refused> {
    precheck(&request).map_err(|why| Refused::new(StatusCode::BAD_REQUEST, why))?;
    agent.jobs().start(request).map_err(|e| match e {
        StartError::Busy(n) => Refused::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "{n} traces run already (the agent's --max-traces): wait for one to end, or end \
                 one with DELETE /traces/ID"
            ),
        ),
        StartError::TooManyProcesses {
            asked,
            covered,
            max,
        } => Refused::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "this trace would cover {asked} processes and the running traces cover \
                 {covered}; together they may cover {max} (the agent's --max-processes): wait \
                 for a trace to end, or trace a smaller cgroup"
            ),
        ),
        StartError::Spawn(why) => Refused::new(StatusCode::INTERNAL_SERVER_ERROR, why),
    })
}

async fn start(State(agent): State<Arc<Agent>>, body: Bytes) -> Response {
    let request = match TraceRequest::from_json(&body) {
        Ok(r) => r,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match start_job(&agent, request) {
        Ok(id) => {
            let jobs = agent.jobs();
            match jobs.get(id) {
                Some(job) => json(StatusCode::CREATED, &jobs.status(job)),
                None => error(StatusCode::INTERNAL_SERVER_ERROR, "the trace vanished"),
            }
        }
        Err(refused) => refused.into_response(),
    }
}

fn trace_id(id: &str) -> Result<u64, Refused> {
    id.parse::<u64>().map_err(|_| {
        Refused::new(
            StatusCode::NOT_FOUND,
            format!(
                "no trace \"{}\": ids are numbers (GET /traces)",
                crate::escape::text(id)
            ),
        )
    })
}

fn no_trace(id: u64) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no trace {id} (GET /traces lists those kept)"),
    )
}

async fn one(
    State(agent): State<Arc<Agent>>,
    Path(id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let id = match trace_id(&id) {
        Ok(id) => id,
        Err(refused) => return refused.into_response(),
    };
    if let Some(key) = params.keys().find(|k| *k != "format") {
        return error(
            StatusCode::BAD_REQUEST,
            &format!(
                "unknown parameter \"{}\": GET /traces/ID takes format=",
                crate::escape::text(key)
            ),
        );
    }
    let (path, format) = {
        let mut jobs = agent.jobs();
        jobs.sweep();
        let Some(job) = jobs.get(id) else {
            return no_trace(id);
        };
        let Some(format) = params.get("format") else {
            return json(StatusCode::OK, &jobs.status(job));
        };
        let format = match parse_format(format) {
            Ok(format) => format,
            Err(refused) => return refused.into_response(),
        };
        match jobs.profile_path(id) {
            Some(path) => (path, format),
            None if job.state == JobState::Running => {
                return error(
                    StatusCode::CONFLICT,
                    &format!(
                        "trace {id} has no profile yet: its first is written {} s after it \
                         started",
                        job.request.interval
                    ),
                )
            }
            None => return error(StatusCode::GONE, &format!("trace {id} failed: no profile")),
        }
    };
    profile_response(path, format, View::InuseSpace).await
}

async fn end(State(agent): State<Arc<Agent>>, Path(id): Path<String>) -> Response {
    let id = match trace_id(&id) {
        Ok(id) => id,
        Err(refused) => return refused.into_response(),
    };
    let mut jobs = agent.jobs();
    if !jobs.cancel(id) {
        return no_trace(id);
    }
    match jobs.get(id) {
        Some(job) => json(StatusCode::ACCEPTED, &jobs.status(job)),
        None => no_trace(id),
    }
}

fn parse_format(name: &str) -> Result<Format, Refused> {
    <Format as clap::ValueEnum>::from_str(name, true).map_err(|_| {
        Refused::new(
            StatusCode::BAD_REQUEST,
            format!(
                "format \"{}\" is not one of pprof, json, collapsed, flamegraph, speedscope, text",
                crate::escape::text(name)
            ),
        )
    })
}

/// A saved snapshot rendered in `format` (on a blocking thread: a big
/// profile takes a while).
async fn profile_response(path: std::path::PathBuf, format: Format, view: View) -> Response {
    let rendered = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<u8>> {
        let mut profile = crate::saved::load(&path)?;
        let options = crate::report::RenderOptions {
            format,
            view,
            top: 20,
            sort: crate::report::Sort::Inuse,
        };
        profile.sort_stacks(options.sort);
        let mut out = Vec::new();
        crate::report::render(&profile, &options, &mut out)?;
        Ok(out)
    })
    .await;
    match rendered {
        Ok(Ok(body)) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, content_type(format))],
            body,
        )
            .into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn content_type(format: Format) -> &'static str {
    match format {
        Format::Pprof => "application/octet-stream",
        Format::Json | Format::Speedscope => "application/json",
        Format::Flamegraph => "image/svg+xml",
        _ => "text/plain; charset=utf-8",
    }
}

async fn heap(state: State<Arc<Agent>>, query: Query<HashMap<String, String>>) -> Response {
    on_demand(state, query, View::InuseSpace).await
}

async fn allocs(state: State<Arc<Agent>>, query: Query<HashMap<String, String>>) -> Response {
    on_demand(state, query, View::AllocSpace).await
}

/// Go's shape: trace the window, then answer with its pprof: in use at
/// the end of the blocks allocated in it, and its allocations.
async fn on_demand(
    State(agent): State<Arc<Agent>>,
    Query(params): Query<HashMap<String, String>>,
    view: View,
) -> Response {
    let request = match TraceRequest::from_query(&params) {
        Ok(r) => r,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    // The tracer's start and its report, beyond the window.
    let deadline = tokio::time::Instant::now()
        + Duration::from_secs_f64(request.seconds)
        + Duration::from_secs(120);
    let id = match start_job(&agent, request) {
        Ok(id) => id,
        Err(refused) => return refused.into_response(),
    };
    let path = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match window_state(&agent, id, deadline) {
            Ok(None) => continue,
            Ok(Some(path)) => break path,
            Err(refused) => return refused.into_response(),
        }
    };
    profile_response(path, Format::Pprof, view).await
}

/// An on-demand trace's state: None while it runs, its profile once done,
/// an error response when it failed or outlived `deadline` (then ended).
fn window_state(
    agent: &Agent,
    id: u64,
    deadline: tokio::time::Instant,
) -> Result<Option<std::path::PathBuf>, Refused> {
    let mut jobs = agent.jobs();
    jobs.sweep();
    let Some(job) = jobs.get(id) else {
        return Err(Refused::new(
            StatusCode::NOT_FOUND,
            format!("no trace {id}"),
        ));
    };
    match job.state {
        JobState::Running if tokio::time::Instant::now() < deadline => Ok(None),
        JobState::Running => {
            jobs.cancel(id);
            Err(Refused::new(
                StatusCode::GATEWAY_TIMEOUT,
                "the trace did not end in time",
            ))
        }
        JobState::Failed => {
            let why = jobs.status(job).error.unwrap_or_default();
            Err(Refused::new(
                StatusCode::BAD_GATEWAY,
                format!("the trace failed: {why}"),
            ))
        }
        JobState::Done => match jobs.profile_path(id) {
            Some(path) => Ok(Some(path)),
            None => Err(Refused::new(
                StatusCode::BAD_GATEWAY,
                "the trace left no profile",
            )),
        },
    }
}
