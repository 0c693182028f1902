//! The push: a bounded queue of encoded requests and one thread that
//! POSTs them in order, retrying with exponential backoff. The trace only
//! ever puts a request in the queue (a mutex held for a push), so a
//! collector that is slow, down or silent never holds the trace up; the
//! queue keeps at most `QUEUE` requests (the oldest is dropped for a new
//! one, counted), and the end of the trace waits a bounded time for the
//! last ones.
//!
//! Retries follow the OTLP/HTTP specification: 429, 502, 503 and 504 and
//! failures to connect or to read an answer are retried (after
//! `Retry-After` when the answer has one, else after a backoff that
//! doubles), any other status is final.

use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use prost::Message as _;

use super::endpoint::Destination;
use super::http::{self, Reply};
use crate::{console, escape};

/// Requests waiting to be sent, at most; each holds one encoded profile.
pub const QUEUE: usize = 8;

/// How the thread retries.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// The wait after the first failure; doubled after each one.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Sends of one request, at most, before it is dropped.
    pub attempts: u32,
    /// One request's time to connect, send and be answered.
    pub request_timeout: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            first_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            attempts: 6,
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// A `Retry-After` longer than this is cut to it.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What happened to the pushes so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests the collector accepted (2xx).
    pub sent: u64,
    /// Sends that failed: refused, unanswered or answered with an error
    /// (a request retried twice and then accepted counts 2 here).
    pub failed: u64,
    /// Requests never delivered: pushed out of a full queue, refused for
    /// good, out of attempts, or still waiting when the trace ended.
    pub dropped: u64,
    /// Requests waiting now (the one being sent is not counted).
    pub queued: u64,
}

/// The exporter's thread and its queue. `finish` ends it.
pub struct Exporter {
    shared: Arc<Shared>,
    /// Closed when the thread ends.
    done: mpsc::Receiver<()>,
    pub url: String,
}

struct Shared {
    state: Mutex<State>,
    /// Rung when a request is queued and when the trace ends.
    wake: Condvar,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Vec<u8>>,
    /// The trace ended: send what is queued until then, and stop.
    deadline: Option<Instant>,
    stats: Stats,
    /// Failures since the last success (the first is said on stderr).
    failing: u64,
    /// The thread is sending a request.
    in_flight: bool,
    /// `finish` is over and counted what was left: the thread's last
    /// request is no longer counted (it was counted dropped).
    abandoned: bool,
}

impl Exporter {
    pub fn start(dest: Destination, policy: Policy) -> std::io::Result<Exporter> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let (tx, done) = mpsc::channel();
        let url = dest.url.clone();
        let worker = Worker {
            shared: Arc::clone(&shared),
            dest,
            policy,
        };
        thread::Builder::new().name("otlp".into()).spawn(move || {
            worker.run();
            drop(tx);
        })?;
        Ok(Exporter { shared, done, url })
    }

    /// Queues `request` for sending; never waits for the network. A full
    /// queue drops its oldest request (the newest profile is the one worth
    /// sending).
    pub fn push(&self, request: Vec<u8>) {
        let mut s = self.shared.lock();
        if s.queue.len() >= QUEUE {
            s.queue.pop_front();
            s.stats.dropped += 1;
        }
        s.queue.push_back(request);
        s.stats.queued = s.queue.len() as u64;
        drop(s);
        self.shared.wake.notify_all();
    }

    pub fn stats(&self) -> Stats {
        self.shared.lock().stats
    }

    /// Ends the exporter: `last` (the final profile) goes first, being the
    /// whole trace, then what is queued, until `wait` is over;
    /// what is left then is dropped (counted) and the thread is left to
    /// end on its own: a request it sends now has at most its own
    /// timeout, and the tracer does not wait for it. `waiting` is
    /// called once if the wait lasts beyond `quiet` (to say so).
    pub fn finish(
        self,
        last: Option<Vec<u8>>,
        wait: Duration,
        quiet: Duration,
        waiting: impl FnOnce(),
    ) -> Stats {
        let deadline = Instant::now() + wait;
        let mut s = self.shared.lock();
        if let Some(last) = last {
            if s.queue.len() >= QUEUE {
                s.queue.pop_front();
                s.stats.dropped += 1;
            }
            s.queue.push_front(last);
        }
        s.deadline = Some(deadline);
        drop(s);
        self.shared.wake.notify_all();
        if self.done.recv_timeout(quiet.min(wait)) == Err(mpsc::RecvTimeoutError::Timeout) {
            waiting();
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = self.done.recv_timeout(left);
        }
        let mut s = self.shared.lock();
        // Still queued, or still being sent when the wait ended: not
        // delivered (the thread no longer counts the one it sends).
        s.stats.dropped += s.queue.len() as u64 + u64::from(s.in_flight);
        s.queue.clear();
        s.stats.queued = 0;
        s.abandoned = true;
        s.stats
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding it leaves counts that are still
        // counts: go on with them.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The thread's side.
struct Worker {
    shared: Arc<Shared>,
    dest: Destination,
    policy: Policy,
}

/// What one send came to.
enum Outcome {
    Sent,
    Retry(Option<Duration>, String),
    Final(String),
}

impl Worker {
    fn run(&self) {
        while let Some(request) = self.next() {
            let delivered = self.deliver(&request);
            let mut s = self.shared.lock();
            s.in_flight = false;
            if !s.abandoned {
                match delivered {
                    true => s.stats.sent += 1,
                    false => s.stats.dropped += 1,
                }
            }
        }
    }

    /// The next request, waiting for one; None when the trace ended and
    /// the queue is empty or the deadline passed.
    fn next(&self) -> Option<Vec<u8>> {
        let mut s = self.shared.lock();
        loop {
            if s.deadline.is_some_and(|d| Instant::now() >= d) {
                return None;
            }
            if let Some(request) = s.queue.pop_front() {
                s.stats.queued = s.queue.len() as u64;
                s.in_flight = true;
                return Some(request);
            }
            if s.deadline.is_some() {
                return None;
            }
            s = self
                .shared
                .wake
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Sends `request` until it is accepted (true), refused for good, out
    /// of attempts, or the trace's end deadline passes.
    fn deliver(&self, request: &[u8]) -> bool {
        let mut backoff = self.policy.first_backoff;
        for attempt in 1..=self.policy.attempts {
            let end = self.shared.lock().deadline;
            let mut deadline = Instant::now() + self.policy.request_timeout;
            if let Some(end) = end {
                deadline = deadline.min(end);
            }
            let outcome = match http::post(&self.dest, request, deadline) {
                Ok(reply) => judge(&reply),
                Err(e) => Outcome::Retry(None, e.to_string()),
            };
            let retry_after = match outcome {
                Outcome::Sent => {
                    let mut s = self.shared.lock();
                    if s.failing > 0 {
                        console::say(format_args!(
                            "OTLP: {} takes profiles again after {}",
                            self.dest.url,
                            crate::report::counted(s.failing, "failed send", "failed sends")
                        ));
                    }
                    s.failing = 0;
                    return true;
                }
                Outcome::Final(why) => {
                    self.failed(&why, "not retried: the request is dropped");
                    return false;
                }
                Outcome::Retry(after, why) => {
                    self.failed(&why, "retrying with backoff");
                    after
                }
            };
            if attempt == self.policy.attempts {
                break;
            }
            let wait = retry_after.unwrap_or(backoff).min(MAX_RETRY_AFTER);
            backoff = (backoff * 2).min(self.policy.max_backoff);
            if !self.sleep(wait) {
                break;
            }
        }
        false
    }

    /// Counts a failed send; the first of a run of failures is said.
    fn failed(&self, why: &str, then: &str) {
        let mut s = self.shared.lock();
        if s.abandoned {
            return;
        }
        s.stats.failed += 1;
        s.failing += 1;
        if s.failing == 1 {
            console::warn(format_args!(
                "OTLP: sending to {} failed: {}; {then} (--verbose counts the pushes)",
                self.dest.url,
                escape::text(why)
            ));
        }
    }

    /// Waits `wait` before the next attempt; false when the trace's end
    /// deadline comes first (the request is then given up).
    fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut s = self.shared.lock();
        loop {
            if s.deadline.is_some_and(|d| until > d) {
                return false;
            }
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return true;
            };
            s = self
                .shared
                .wake
                .wait_timeout(s, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// What a collector's answer means for the request.
fn judge(reply: &Reply) -> Outcome {
    match reply.status {
        200..=299 => {
            if let Some(words) = partial_success(&reply.body) {
                console::warn(format_args!(
                    "OTLP: the collector accepted part of a profile: {words}"
                ));
            }
            Outcome::Sent
        }
        429 | 502 | 503 | 504 => Outcome::Retry(reply.retry_after, status_words(reply)),
        _ => Outcome::Final(status_words(reply)),
    }
}

/// `HTTP 404` and the start of the body, raw: `failed` escapes it.
fn status_words(reply: &Reply) -> String {
    let body = String::from_utf8_lossy(&reply.body);
    let body: String = body.chars().take(200).collect();
    match body.trim() {
        "" => format!("HTTP {}", reply.status),
        text => format!("HTTP {}: {text}", reply.status),
    }
}

/// A 2xx answer's `partial_success`, in words, when it rejected something
/// or says something.
fn partial_success(body: &[u8]) -> Option<String> {
    use crate::report::otlp_proto::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceResponse;
    let response = ExportProfilesServiceResponse::decode(body).ok()?;
    let p = response.partial_success?;
    if p.rejected_profiles == 0 && p.error_message.is_empty() {
        return None;
    }
    Some(format!(
        "{} rejected: {}",
        p.rejected_profiles,
        escape::text(&p.error_message)
    ))
}

#[cfg(test)]
mod tests;
