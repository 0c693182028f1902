//! `--serve ADDR`: the profile over HTTP while the trace goes on, for
//! `go tool pprof`, scrapers (Pyroscope, Parca, Alloy) and Prometheus.
//!
//! The server runs on a thread of its own with its own tokio runtime. It
//! never touches the trace: it asks the trace's loop for a snapshot through
//! a channel (`SnapshotRequests`), the loop builds one between drains and
//! hands back an `Arc<Profile>`, and the server renders it. A slow, stuck
//! or malformed client therefore costs the loop nothing; the only work the
//! loop does for HTTP is one snapshot at a time, and recent ones are
//! shared by every request (see `app::App::snapshot`).

mod app;
mod chart;
mod conns;
mod delta;
mod metrics;
mod page;
mod page_flame;
mod page_parts;
mod routes;

use std::{net::SocketAddr, sync::Arc, thread::JoinHandle, time::Duration};

use anyhow::Context as _;
use tokio::sync::{mpsc, oneshot};

use crate::{report::Profile, trace_stats::TraceStats};

/// Longest a connection lives, whatever it does: a delta profile's window
/// plus time to build and send it.
const CONNECTION_TIME: Duration =
    Duration::from_secs(app::MAX_DELTA_SECS + app::REQUEST_SLACK_SECS);
/// Largest request head read (hyper's smallest buffer allowed is 8 KiB).
const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// What the server sends the trace's loop: where to hand back a snapshot,
/// and the `?min_age=` and delta window it is for.
pub struct SnapshotReply {
    sender: oneshot::Sender<Snapshot>,
    /// Seconds a block must have been live to count as in use (0: every
    /// block); None: the trace's own --min-age.
    pub min_age: Option<f64>,
    /// The end of a delta window: only blocks allocated since this
    /// `Snapshot::taken_ns` (the window's first snapshot) count as in use.
    pub born_since_ns: Option<u64>,
}

impl SnapshotReply {
    /// The client gave up waiting.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    pub fn send(self, snapshot: Snapshot) -> Result<(), Snapshot> {
        self.sender.send(snapshot)
    }
}

/// A snapshot of the trace, built by the trace's loop.
pub struct Snapshot {
    pub profile: Arc<Profile>,
    /// The trace's numbers when the snapshot was built.
    pub stats: TraceStats,
    /// When it was built (`collect::monotonic_ns`), every event before
    /// read: where a delta window that starts with it starts.
    pub taken_ns: u64,
}

/// The trace loop's end of the channel: snapshot requests from the server.
pub struct SnapshotRequests(mpsc::Receiver<SnapshotReply>);

impl SnapshotRequests {
    /// The next request; never resolves once the server is gone (so a
    /// `select!` branch on it just stays quiet).
    pub async fn next(&mut self) -> SnapshotReply {
        match self.0.recv().await {
            Some(reply) => reply,
            None => std::future::pending().await,
        }
    }
}

/// The listening socket, bound before anything is attached: a port in use
/// must not cost a trace.
pub struct Bound {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl Bound {
    pub fn bind(addr: SocketAddr) -> anyhow::Result<Bound> {
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            let hint = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "another program listens there: pick another port, or stop it"
                }
                std::io::ErrorKind::AddrNotAvailable => {
                    "no interface of this machine has that address: use 127.0.0.1 or one of \
                     `ip -brief address`"
                }
                std::io::ErrorKind::PermissionDenied => {
                    "ports below 1024 need CAP_NET_BIND_SERVICE: pick a port from 1024 up"
                }
                _ => "pick another address or port",
            };
            anyhow::anyhow!("--serve {addr}: cannot listen ({e}): {hint}")
        })?;
        listener
            .set_nonblocking(true)
            .context("--serve: making the listening socket non-blocking")?;
        let addr = listener.local_addr().unwrap_or(addr);
        if !addr.ip().is_loopback() {
            crate::console::warn(format_args!(
                "--serve {addr} is not a loopback address: anyone who can reach it can read the \
                 profile (call stacks, command lines, paths)"
            ));
        }
        Ok(Bound { listener, addr })
    }

    /// Starts the server on its own thread; the trace's loop answers the
    /// returned requests.
    pub fn start(self, target: String) -> anyhow::Result<(Server, SnapshotRequests)> {
        // One request waits at a time: the server shares one snapshot
        // between all its requests.
        let (requests, receiver) = mpsc::channel(1);
        let (stop, stopped) = oneshot::channel();
        let app = Arc::new(app::App::new(requests, target));
        let listener = self.listener;
        let thread = std::thread::Builder::new()
            .name("memtrace-serve".into())
            .spawn(move || serve_thread(listener, app, stopped))
            .context("--serve: starting the server thread")?;
        crate::console::say(format_args!(
            "serving the profile on http://{}/ (/debug/pprof/heap, /metrics, ...)",
            self.addr
        ));
        Ok((
            Server {
                stop: Some(stop),
                thread: Some(thread),
            },
            SnapshotRequests(receiver),
        ))
    }
}

/// The running server; stopping it (or dropping it) closes the listening
/// socket and every connection.
pub struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // The thread only leaves its accept loop and drops its runtime
            // without waiting for connections: this join is quick.
            let _ = thread.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn serve_thread(
    listener: std::net::TcpListener,
    app: Arc<app::App>,
    stopped: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Rendering runs here (a flamegraph of many stacks takes a while).
        .max_blocking_threads(2)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            crate::console::warn(format_args!("--serve stopped: no tokio runtime: {e}"));
            return;
        }
    };
    if let Err(e) = runtime.block_on(accept_loop(listener, app, stopped)) {
        crate::console::warn(format_args!("--serve stopped: {e:#}"));
    }
    // Every request read was answered (accept_loop drained them): what
    // is left is idle or stuck, and is dropped.
    runtime.shutdown_background();
}

/// Accepts connections within the budget (serve/conns.rs) until told to
/// stop; then ends the app's requests and drains the connections.
async fn accept_loop(
    listener: std::net::TcpListener,
    app: Arc<app::App>,
    mut stopped: oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let listener =
        tokio::net::TcpListener::from_std(listener).context("registering the listener")?;
    let router = routes::router(app.clone());
    let budget = conns::Budget::new();
    loop {
        let stream = tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of file descriptors, or a connection reset before
                    // it was accepted: do not spin on it.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (router, budget) = (router.clone(), budget.clone());
        match budget.try_slot() {
            Some(slot) => drop(tokio::spawn(serve(stream, router, budget, slot))),
            None => drop(tokio::spawn(async move {
                match budget.wait_slot(&stream).await {
                    Some(slot) => serve(stream, router, budget, slot).await,
                    None => conns::refuse(&stream),
                }
            })),
        }
    }
    // No new connections; requests waiting for a snapshot or a delta's
    // window answer now, and the server waits for those answers.
    drop(listener);
    app.end();
    budget.drain().await;
    Ok(())
}

/// Serves one connection in its slot, until it ends, outlives
/// `CONNECTION_TIME`, or the budget closes or shuts it down.
async fn serve(
    stream: tokio::net::TcpStream,
    router: axum::Router,
    budget: Arc<conns::Budget>,
    slot: conns::Slot,
) {
    let inner = hyper_util::service::TowerToHyperService::new(router);
    let conn = slot.conn.clone();
    let service = hyper::service::service_fn(move |request| {
        let busy = budget.busy(&conn);
        let answer = hyper::service::Service::call(&inner, request);
        async move {
            let response = answer.await;
            drop(busy);
            response
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(conns::HEADER_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(connection);
    let deadline = tokio::time::sleep(CONNECTION_TIME);
    tokio::pin!(deadline);
    tokio::select! {
        _ = connection.as_mut() => {}
        () = &mut deadline => {}
        () = slot.conn.close.notified() => {}
        () = slot.conn.shutdown.notified() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection.as_mut() => {}
                () = &mut deadline => {}
            }
        }
    }
}
