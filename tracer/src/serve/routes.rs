//! The endpoints. Every one renders a snapshot the trace's loop built; none
//! reads a file or takes a path from the request. Only GET (and HEAD).

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    extract::{Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};

use super::{
    app::{error, min_age, pprof, render, render_as, respond, App},
    delta, metrics, page,
};
use crate::report::{Format, View};

/// A snapshot this young is shared instead of building another: parallel
/// scrapes cost the trace one snapshot.
const SHARE_SNAPSHOT: Duration = Duration::from_secs(1);
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
