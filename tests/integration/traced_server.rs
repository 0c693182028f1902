//! A server traced by pid answers every request: while traced, and across
//! the tracer's attach and detach, when the kernel writes the uprobes'
//! breakpoints into the running code and takes them out again while its
//! threads run through the allocator. tests/targets/http_server.c is shaped
//! like actix-web (an accepting thread, worker threads with their own epoll
//! loops, a handler that allocates a few blocks per request); clients on
//! keep-alive and on new connections keep requests in flight the whole time,
//! at the default sampling rate, with `--unwind dwarf` and exact.
//!
//! The only deadline is the clients' per-request socket timeout, far above
//! what a request takes on a loaded machine.

use std::{
    io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::harness::{compile_c, function_names, sites::O2_FLAGS, JsonTracer, Target};

/// Client threads, each with one request in flight at a time.
const CLIENTS: u64 = 16;
/// A request not answered within this is lost.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long `wait_for_answers` waits for the answers it asks for.
const PROGRESS: Duration = Duration::from_secs(120);

/// Requests answered and the requests that were not (with why).
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    lost: Mutex<Vec<String>>,
}

/// Clients sending requests until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    clients: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Tally::default());
        let clients = (0..CLIENTS)
            .map(|id| {
                let (stop, tally) = (stop.clone(), tally.clone());
                thread::spawn(move || client(addr, id, &stop, &tally))
            })
            .collect();
        Load {
            stop,
            tally,
            clients,
        }
    }

    fn answered(&self) -> u64 {
        self.tally.answered.load(Ordering::Relaxed)
    }

    /// Waits until `more` further requests have been answered.
    fn wait_for_answers(&self, more: u64, what: &str) {
        let goal = self.answered() + more;
        let start = Instant::now();
        while self.answered() < goal {
            assert!(
                start.elapsed() < PROGRESS,
                "{what}: {} of {more} requests answered in {PROGRESS:?}; lost: {:#?}",
                more - (goal - self.answered()),
                self.tally.lost.lock().expect("lost list")
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the clients: (requests answered, requests lost).
    fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("client thread");
        }
        let lost = std::mem::take(&mut *self.tally.lost.lock().expect("lost list"));
        (self.tally.answered.load(Ordering::Relaxed), lost)
    }
}

/// One client: every other request asks for `Connection: close`, so both
/// new connections and requests on kept-alive ones are always in flight.
/// The server closes a connection only when asked to, so any error or
/// early end of a kept connection is a lost request.
fn client(addr: SocketAddr, id: u64, stop: &AtomicBool, tally: &Tally) {
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut n = id * 1_000_000_000;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let keep = n.is_multiple_of(2);
        let fresh = conn.is_none();
        match request(addr, &mut conn, n, keep) {
            Ok(()) => {
                tally.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let on = if fresh { "new" } else { "kept-alive" };
                let e = match e.kind() {
                    // What a socket timeout reads as.
                    ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                        format!("no answer within {DEADLINE:?}")
                    }
                    _ => e.to_string(),
                };
                let mut lost = tally.lost.lock().expect("lost list");
                lost.push(format!("request {n} on a {on} connection: {e}"));
                conn = None;
            }
        }
        if !keep {
            conn = None;
        }
    }
}

/// GET /r/N on `conn` (connected first if None); checks the answer is N's.
fn request(
    addr: SocketAddr,
    conn: &mut Option<BufReader<TcpStream>>,
    n: u64,
    keep: bool,
) -> std::io::Result<()> {
    let reader = match conn {
        Some(r) => r,
        None => {
            let stream = TcpStream::connect_timeout(&addr, DEADLINE)?;
            stream.set_read_timeout(Some(DEADLINE))?;
            stream.set_write_timeout(Some(DEADLINE))?;
            conn.insert(BufReader::new(stream))
        }
    };
    let close = if keep { "" } else { "Connection: close\r\n" };
    write!(
        reader.get_mut(),
        "GET /r/{n} HTTP/1.1\r\nHost: test\r\n{close}\r\n"
    )?;
    let mut length = None;
    let mut status = String::new();
    reader.read_line(&mut status)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("connection closed in the headers"));
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.strip_prefix("Content-Length: ") {
            length = v.trim().parse::<usize>().ok();
        }
    }
    let mut body = vec![0; length.ok_or_else(|| std::io::Error::other("no Content-Length"))?];
    reader.read_exact(&mut body)?;
    let body = String::from_utf8_lossy(&body);
    if !status.starts_with("HTTP/1.1 200") || !body.starts_with(&format!("{n} ")) {
        return Err(std::io::Error::other(format!(
            "answered {status:?} {body:?}"
        )));
    }
    Ok(())
}

/// The allocations of the server's request handler are in the report: its
/// probes were live while requests were served.
fn assert_handler_traced(report: &serde_json::Value, mode: &str) {
    let stacks = report["stacks"].as_array().expect("stacks");
    assert!(
        stacks.iter().any(|s| function_names(s).contains(&"handle")),
        "{mode}: no stack through the request handler in {} stacks",
        stacks.len()
    );
}

#[test]
fn a_traced_server_answers_every_request_across_attach_and_detach() {
    let bin = compile_c("http_server", "o2", O2_FLAGS);
    let mut server = Target::start(&bin, &[]);
    let port = server.wait_for("port ");
    let port: u16 = port["port ".len()..].trim().parse().expect("a port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let pid = server.pid().to_string();
    let load = Load::start(addr);
    load.wait_for_answers(200, "untraced");
    let modes: [(&str, &[&str]); 3] = [
        ("default", &[]),
        ("dwarf", &["--unwind", "dwarf"]),
        ("exact", &["--sample-rate", "1"]),
    ];
    let mut traced = 0;
    for (mode, extra) in modes {
        let args = [&["--pid", pid.as_str()][..], extra].concat();
        // Attached, and later detached, while requests are in flight.
        let tracer = JsonTracer::start_sampling(&format!("traced-server-{mode}"), &args);
        let before = load.answered();
        load.wait_for_answers(500, mode);
        traced += load.answered() - before;
        let (report, _) = tracer.stop();
        assert_handler_traced(&report, mode);
        load.wait_for_answers(100, "after the detach");
    }
    let (answered, lost) = load.finish();
    assert!(
        lost.is_empty(),
        "{} of {} requests lost (at least {traced} answered while traced):\n{}",
        lost.len(),
        answered + lost.len() as u64,
        lost.join("\n")
    );
}
