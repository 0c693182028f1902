//! The connection budget. At most `MAX_CONNECTIONS` are served at once,
//! and held connections cannot lock other clients out:
//!
//! - long requests (`/debug/pprof/allocs?seconds=N`) have a budget of their
//!   own, a quarter of it (routes.rs, `MAX_DELTAS`): the rest is left to
//!   the quick snapshot endpoints;
//! - a connection waits `HEADER_TIMEOUT` at most for a request, the first
//!   or the next kept-alive one; when every slot is taken, a new client
//!   that sends its request waits a moment while connections idle for
//!   `GRACE` or more are closed for it (a client that connects and says
//!   nothing, or keeps an unused connection alive); one that sends nothing
//!   never takes a slot from one that did;
//! - when the trace ends, every request the server has read gets its
//!   answer (routes.rs answers 503 with the reason) before the server
//!   stops; idle connections are closed.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client gets to send a request's headers, the first one or
/// the next on a kept-alive connection (hyper times both).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection idle this long may be closed for a new client when every
/// slot is taken (younger: its request may be on its way, or its response
/// still being sent).
const GRACE: Duration = Duration::from_secs(1);
/// How long a new client that sent its request waits for a slot before
/// a 503.
const SLOT_WAIT: Duration = Duration::from_secs(5);
/// New clients waiting for a slot at once; more get the 503 at once.
const MAX_WAITING: usize = 256;
/// How long the server, stopping, waits for the requests it has read to be
/// answered (each is answered at once: the trace has ended).
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// One connection, as the budget sees it.
pub struct Conn {
    /// Requests of this connection being answered.
    busy: AtomicUsize,
    /// When it last became idle, in ms after `Budget::epoch`.
    idle_since_ms: AtomicU64,
    /// Close now, dropping the connection.
    pub close: Notify,
    /// Finish the request being answered (if any), then close.
    pub shutdown: Notify,
}

/// Marks a connection busy while a request of it is being answered.
pub struct Busy {
    conn: Arc<Conn>,
    budget: Arc<Budget>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.conn
            .idle_since_ms
            .store(self.budget.now_ms(), Ordering::Relaxed);
        self.conn.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The slots and the connections holding them.
pub struct Budget {
    slots: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    epoch: Instant,
}

/// A connection's slot: frees it and forgets the connection when dropped.
pub struct Slot {
    id: u64,
    pub conn: Arc<Conn>,
    budget: Arc<Budget>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.lock().remove(&self.id);
    }
}

impl Budget {
    pub fn new() -> Arc<Budget> {
        Arc::new(Budget {
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            waiting: Arc::new(Semaphore::new(MAX_WAITING)),
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        // A panic while holding it leaves a map that is still whole.
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot now, if one is free.
    pub fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(self.slot(permit))
    }

    /// A slot for `stream` once it has sent something, within `SLOT_WAIT`,
    /// closing idle connections for it; None when none came (or too many
    /// wait already, or it sent nothing).
    pub async fn wait_slot(self: &Arc<Self>, stream: &tokio::net::TcpStream) -> Option<Slot> {
        let _waiting = self.waiting.clone().try_acquire_owned().ok()?;
        // Readable: its request came, or it closed (then hyper sees it).
        tokio::time::timeout(HEADER_TIMEOUT, stream.readable())
            .await
            .ok()?
            .ok()?;
        let deadline = tokio::time::Instant::now() + SLOT_WAIT;
        loop {
            self.close_idle();
            let step = tokio::time::Instant::now() + GRACE / 4;
            let permit =
                tokio::time::timeout_at(step.min(deadline), self.slots.clone().acquire_owned());
            if let Ok(Ok(permit)) = permit.await {
                return Some(self.slot(permit));
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
        }
    }

    fn slot(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> Slot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            close: Notify::new(),
            shutdown: Notify::new(),
        });
        self.lock().insert(id, conn.clone());
        Slot {
            id,
            conn,
            budget: self.clone(),
            _permit: permit,
        }
    }

    /// Marks `conn` busy until the returned guard is dropped.
    pub fn busy(self: &Arc<Self>, conn: &Arc<Conn>) -> Busy {
        conn.busy.fetch_add(1, Ordering::Relaxed);
        Busy {
            conn: conn.clone(),
            budget: self.clone(),
        }
    }

    /// Idle for `GRACE` or more.
    fn long_idle(&self, conn: &Conn) -> bool {
        let idle_since = conn.idle_since_ms.load(Ordering::Relaxed);
        conn.busy.load(Ordering::Relaxed) == 0
            && self.now_ms().saturating_sub(idle_since) >= GRACE.as_millis() as u64
    }

    /// Closes the connections idle for `GRACE` or more.
    fn close_idle(&self) {
        for conn in self.lock().values() {
            if self.long_idle(conn) {
                conn.close.notify_one();
            }
        }
    }

    /// The server stops: long-idle connections close now, the others once
    /// their request is answered; returns when all have (or after
    /// `DRAIN_TIME`).
    pub async fn drain(&self) {
        for conn in self.lock().values() {
            if self.long_idle(conn) {
                conn.close.notify_one();
            } else {
                conn.shutdown.notify_one();
            }
        }
        let all = MAX_CONNECTIONS as u32;
        let _ = tokio::time::timeout(DRAIN_TIME, self.slots.acquire_many(all)).await;
    }
}

/// What a client gets when no slot came: a 503 (best effort: the socket's
/// buffer takes it or not). What it sent is read first, so that closing
/// the socket does not reset it before the client reads the 503.
pub fn refuse(stream: &tokio::net::TcpStream) {
    let mut sink = [0; 4096];
    for _ in 0..4 {
        if !matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    let body = format!(
        "memtrace-bpf: {MAX_CONNECTIONS} connections are open already and none is idle: \
         try again in a moment\n"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
}
