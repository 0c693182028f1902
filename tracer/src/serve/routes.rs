//! The endpoints. Every one renders a snapshot the trace's loop built; none
//! reads a file or takes a path from the request. Only GET (and HEAD).

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    extract::{Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tokio::sync::{mpsc, watch, Mutex, Semaphore};

use super::{delta, metrics, page, Snapshot, SnapshotReply};
use crate::report::{self, Format, Profile, RenderOptions, View};

/// Longest `?seconds=N` delta profile.
pub const MAX_DELTA_SECS: u64 = 300;
/// Delta profiles in progress at once: a quarter of the connections, so
/// held deltas leave the rest to the quick snapshot endpoints.
pub(super) const MAX_DELTAS: usize = super::conns::MAX_CONNECTIONS / 4;
/// Time for a request beyond its delta window: to wait for the snapshot,
/// render and send it.
pub const REQUEST_SLACK_SECS: u64 = 60;
/// A snapshot this young is shared instead of building another: parallel
/// scrapes cost the trace one snapshot.
const SHARE_SNAPSHOT: Duration = Duration::from_secs(1);
/// How long a request waits for the trace's loop to build a snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30);

/// What every endpoint is, for `/` and the 404.
const ENDPOINTS: &str = "\
/                          the live page: flamegraph, in-use bytes over time, top growing stacks (HTML)
/debug/pprof/heap          pprof, in-use space by default (go tool pprof)
/debug/pprof/allocs        pprof, allocated space by default
?seconds=N                 on both: the next N s (1 to 300): allocated then, and in use of those blocks
/flamegraph.svg?view=V     SVG flamegraph; V: inuse-space (default), inuse-objects, alloc-space, alloc-objects, peak-space, peak-objects
/profile.json              the whole profile as JSON (the schema of --format json)
/metrics                   Prometheus text: live bytes and objects, events, loss counters, tracer CPU and RSS
?min_age=SECS              on every endpoint: in use counts only blocks live at least SECS (0: all; default: --min-age)
";

pub struct App {
    requests: mpsc::Sender<SnapshotReply>,
    /// The last snapshot, when it was asked for and what it counts as in
    /// use. The lock is held while a new one is built: requests that come
    /// meanwhile wait and share it (if they ask for the same).
    last: Mutex<Option<(Instant, InUse, Arc<Snapshot>)>>,
    /// What is traced, for the index page.
    target: String,
    /// Delta profiles (`?seconds=N`) in progress.
    pub(super) deltas: Arc<Semaphore>,
    /// True once the trace has ended: waiting requests answer then.
    ended: watch::Sender<bool>,
}

impl App {
    pub fn new(requests: mpsc::Sender<SnapshotReply>, target: String) -> App {
        App {
            requests,
            last: Mutex::new(None),
            target,
            deltas: Arc::new(Semaphore::new(MAX_DELTAS)),
            ended: watch::Sender::new(false),
        }
    }

    /// The trace has ended: requests waiting for a snapshot or a delta's
    /// window answer now.
    pub fn end(&self) {
        self.ended.send_replace(true);
    }

    /// Resolves once the trace has ended.
    pub(super) async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|&e| e).await;
    }

    /// A snapshot no older than `max_age` (the last one, or a new one from
    /// the trace's loop), with in-use counting only blocks live at least
    /// `min_age` seconds (None: the trace's --min-age).
    async fn snapshot_aged(
        &self,
        max_age: Duration,
        min_age: MinAge,
    ) -> Result<Arc<Snapshot>, Response> {
        self.snapshot_for(max_age, (min_age, None)).await
    }

    /// A snapshot no older than `max_age` counting as in use what `in_use`
    /// says.
    pub(super) async fn snapshot_for(
        &self,
        max_age: Duration,
        in_use: InUse,
    ) -> Result<Arc<Snapshot>, Response> {
        tokio::select! {
            snapshot = self.snapshot_from_trace(max_age, in_use) => snapshot,
            () = self.ended() => Err(ended()),
        }
    }

    async fn snapshot_from_trace(
        &self,
        max_age: Duration,
        in_use: InUse,
    ) -> Result<Arc<Snapshot>, Response> {
        let mut last = self.last.lock().await;
        if let Some((at, counted, snapshot)) = last.as_ref() {
            if at.elapsed() <= max_age && *counted == in_use {
                return Ok(snapshot.clone());
            }
        }
        let asked = Instant::now();
        let (reply, answer) = tokio::sync::oneshot::channel();
        let (min_age, born_since_ns) = in_use;
        let reply = SnapshotReply {
            sender: reply,
            min_age,
            born_since_ns,
        };
        self.requests.send(reply).await.map_err(|_| ended())?;
        let snapshot = match tokio::time::timeout(SNAPSHOT_TIMEOUT, answer).await {
            Ok(Ok(snapshot)) => Arc::new(snapshot),
            Ok(Err(_)) => return Err(ended()),
            Err(_) => {
                return Err(error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the trace did not build a snapshot in time (it is busy): try again",
                ))
            }
        };
        *last = Some((asked, in_use, snapshot.clone()));
        Ok(snapshot)
    }
}

fn ended() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the trace has ended: no more snapshots (its report has the whole trace)",
    )
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/debug/pprof/heap", get(heap))
        .route("/debug/pprof/allocs", get(allocs))
        .route("/flamegraph.svg", get(flamegraph))
        .route("/profile.json", get(json))
        .route("/metrics", get(prometheus))
        .fallback(not_found)
        .with_state(app)
}

type Params = Query<HashMap<String, String>>;

/// `?min_age=SECS`: None when not given (the trace's --min-age applies).
pub(super) type MinAge = Option<f64>;

/// What a snapshot counts as in use: blocks live at least `?min_age=`,
/// allocated since a delta window opened (its `Snapshot::taken_ns`).
pub(super) type InUse = (MinAge, Option<u64>);

/// The query's `?min_age=`, or a 400 that says what it takes.
fn min_age(params: &HashMap<String, String>) -> Result<MinAge, String> {
    let Some(text) = params.get("min_age") else {
        return Ok(None);
    };
    match text.parse::<f64>() {
        Ok(secs)
            if secs.is_finite() && (0.0..=crate::limits::MAX_DURATION_SECS).contains(&secs) =>
        {
            Ok(Some(secs))
        }
        _ => Err(format!(
            "?min_age= takes the seconds a block must have been live to count as in use, \
             from 0 (every block) to {}",
            crate::limits::MAX_DURATION_SECS
        )),
    }
}

/// The live page (serve/page.rs); `?flame=inuse|growth` picks its
/// flamegraph.
async fn index(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    let flame = match params.get("flame").map(|f| page::Flame::parse(f)) {
        None => page::Flame::Inuse,
        Some(Some(flame)) => flame,
        Some(None) => return error(StatusCode::BAD_REQUEST, "?flame= takes inuse or growth"),
    };
    let min_age = match min_age(&params) {
        Ok(min_age) => min_age,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let snapshot = match app.snapshot_aged(SHARE_SNAPSHOT, min_age).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let target = app.target.clone();
    let body = render(snapshot.profile.clone(), move |p, w| {
        let page = page::Page {
            target: &target,
            flame,
            min_age,
            endpoints: ENDPOINTS,
        };
        page::write_page(p, &page, w)
    });
    let mut response = respond(body.await, "text/html; charset=utf-8", None);
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, page::CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, header::HeaderValue::from_static(value));
    }
    response
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("no such endpoint; memtrace-bpf serves:\n{ENDPOINTS}"),
    )
}

async fn heap(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    pprof_endpoint(&app, &params, View::InuseSpace, "heap").await
}

async fn allocs(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    pprof_endpoint(&app, &params, View::AllocSpace, "allocs").await
}

/// `/debug/pprof/heap` and `/allocs`: the same profile, `view` the sample
/// type pprof shows first, as Go's `net/http/pprof` serves them; with
/// `?seconds=N`, the profile of the next N seconds (serve/delta.rs).
async fn pprof_endpoint(
    app: &App,
    params: &HashMap<String, String>,
    view: View,
    name: &str,
) -> Response {
    let min_age = match min_age(params) {
        Ok(min_age) => min_age,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    if let Some(seconds) = params.get("seconds") {
        return delta::serve(app, seconds, min_age, view, name).await;
    }
    match app.snapshot_aged(SHARE_SNAPSHOT, min_age).await {
        Ok(s) => pprof(s.profile.clone(), view, name).await,
        Err(response) => response,
    }
}

async fn flamegraph(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    let view =
        match params.get("view").map(|v| parse_view(v)) {
            None => View::InuseSpace,
            Some(Some(view)) => view,
            Some(None) => return error(
                StatusCode::BAD_REQUEST,
                "?view= takes inuse-space, inuse-objects, alloc-space, alloc-objects, peak-space \
                 or peak-objects",
            ),
        };
    let min_age = match min_age(&params) {
        Ok(min_age) => min_age,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let snapshot = match app.snapshot_aged(SHARE_SNAPSHOT, min_age).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let body = render_as(snapshot.profile.clone(), Format::Flamegraph, view);
    respond(body.await, "image/svg+xml", None)
}

async fn json(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    let min_age = match min_age(&params) {
        Ok(min_age) => min_age,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    let snapshot = match app.snapshot_aged(SHARE_SNAPSHOT, min_age).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let body = render_as(snapshot.profile.clone(), Format::Json, View::default());
    respond(body.await, "application/json", None)
}

async fn prometheus(State(app): State<Arc<App>>, Query(params): Params) -> Response {
    let min_age = match min_age(&params) {
        Ok(min_age) => min_age,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match app.snapshot_aged(SHARE_SNAPSHOT, min_age).await {
        Ok(s) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            metrics::render(&s.profile, &s.stats),
        )
            .into_response(),
        Err(response) => response,
    }
}

fn parse_view(text: &str) -> Option<View> {
    <View as clap::ValueEnum>::from_str(text, false).ok()
}

/// A pprof profile, as Go's `net/http/pprof` sends one.
pub(super) async fn pprof(profile: Arc<Profile>, view: View, name: &str) -> Response {
    let body = render_as(profile, Format::Pprof, view);
    respond(
        body.await,
        "application/octet-stream",
        Some(&format!("attachment; filename=\"{name}\"")),
    )
}

/// `report::render` in `format`, off the server's event loop.
async fn render_as(profile: Arc<Profile>, format: Format, view: View) -> anyhow::Result<Vec<u8>> {
    let options = RenderOptions {
        format,
        view,
        ..RenderOptions::default()
    };
    render(profile, move |p, w| report::render(p, &options, w)).await
}

/// Renders off the server's event loop: a large profile takes a while.
async fn render(
    profile: Arc<Profile>,
    write: impl FnOnce(&Profile, &mut Vec<u8>) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        write(&profile, &mut out).map(|()| out)
    })
    .await
    .map_err(|e| anyhow::anyhow!("rendering stopped: {e}"))?
}

fn respond(
    body: anyhow::Result<Vec<u8>>,
    content_type: &str,
    disposition: Option<&str>,
) -> Response {
    match body {
        Ok(body) => {
            let mut response =
                ([(header::CONTENT_TYPE, content_type.to_string())], body).into_response();
            if let Some(d) = disposition.and_then(|d| header::HeaderValue::from_str(d).ok()) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_DISPOSITION, d);
            }
            response
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("rendering the profile failed: {e:#}"),
        ),
    }
}

pub(super) fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}
