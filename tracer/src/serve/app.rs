//! What every endpoint shares: the app state (the last snapshot, delta
//! profiles in progress, the trace's end), the `?min_age=` parameter, and
//! rendering a profile into a response.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    http::{header, StatusCode},
    response::{IntoResponse, Response},
};
use tokio::sync::{mpsc, watch, Mutex, Semaphore};

use super::{Snapshot, SnapshotReply};
use crate::report::{self, Format, Profile, RenderOptions, View};

/// Longest `?seconds=N` delta profile.
pub const MAX_DELTA_SECS: u64 = 300;
/// Delta profiles in progress at once: a quarter of the connections, so
/// held deltas leave the rest to the quick snapshot endpoints.
pub(super) const MAX_DELTAS: usize = super::conns::MAX_CONNECTIONS / 4;
/// Time for a request beyond its delta window: to wait for the snapshot,
/// render and send it.
pub const REQUEST_SLACK_SECS: u64 = 60;
/// How long a request waits for the trace's loop to build a snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30);

pub struct App {
    requests: mpsc::Sender<SnapshotReply>,
    /// The last snapshot, when it was asked for and what it counts as in
    /// use. The lock is held while a new one is built: requests that come
    /// meanwhile wait and share it (if they ask for the same).
    last: Mutex<Option<(Instant, InUse, Arc<Snapshot>)>>,
    /// What is traced, for the index page.
    pub(super) target: String,
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
    pub(super) async fn snapshot_aged(
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

pub(super) fn ended() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the trace has ended: no more snapshots (its report has the whole trace)",
    )
}

/// `?min_age=SECS`: None when not given (the trace's --min-age applies).
pub(super) type MinAge = Option<f64>;

/// What a snapshot counts as in use: blocks live at least `?min_age=`,
/// allocated since a delta window opened (its `Snapshot::taken_ns`).
pub(super) type InUse = (MinAge, Option<u64>);

/// The query's `?min_age=`, or a 400 that says what it takes.
pub(super) fn min_age(params: &HashMap<String, String>) -> Result<MinAge, String> {
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
pub(super) async fn render_as(
    profile: Arc<Profile>,
    format: Format,
    view: View,
) -> anyhow::Result<Vec<u8>> {
    let options = RenderOptions {
        format,
        view,
        ..RenderOptions::default()
    };
    render(profile, move |p, w| report::render(p, &options, w)).await
}

/// Renders off the server's event loop: a large profile takes a while.
pub(super) async fn render(
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

pub(super) fn respond(
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
