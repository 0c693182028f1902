//! The agent's listeners: TCP and the Unix socket, each connection served
//! by hyper's HTTP/1 with a time limit on its headers; at most
//! `MAX_CONNECTIONS` at once (more wait in the kernel's backlog). Until
//! SIGINT, SIGTERM or SIGHUP.

use std::{sync::Arc, time::Duration};

use tokio::{
    signal::unix::{signal, SignalKind},
    sync::Semaphore,
};

const MAX_CONNECTIONS: usize = 64;
/// A client that sends no complete request head in this time is dropped.
const HEADER_TIME: Duration = Duration::from_secs(10);

pub async fn serve(
    router: axum::Router,
    tcp: Option<tokio::net::TcpListener>,
    unix: tokio::net::UnixListener,
) -> anyhow::Result<()> {
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let slot = tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            slot = slots.clone().acquire_owned() => slot?,
        };
        let router = router.clone();
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
            accepted = unix.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(async move {
                        connection(stream, router).await;
                        drop(slot);
                    });
                }
            }
            accepted = accept_tcp(tcp.as_ref()) => {
                if let Ok(stream) = accepted {
                    tokio::spawn(async move {
                        connection(stream, router).await;
                        drop(slot);
                    });
                }
            }
        }
    }
    crate::console::say(format_args!(
        "agent stopping: running traces end and write their profiles"
    ));
    Ok(())
}

async fn accept_tcp(
    tcp: Option<&tokio::net::TcpListener>,
) -> std::io::Result<tokio::net::TcpStream> {
    match tcp {
        Some(listener) => listener.accept().await.map(|(stream, _)| stream),
        None => std::future::pending().await,
    }
}

async fn connection<S>(stream: S, router: axum::Router)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(router);
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIME)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let _ = conn.await;
}
