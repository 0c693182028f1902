//! The exporter against servers on the loopback, in this process: one that
//! refuses then accepts, one that never answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;

use super::*;
use crate::otlp::endpoint::resolve;

fn fast() -> Policy {
    Policy {
        first_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        attempts: 6,
        request_timeout: Duration::from_secs(5),
    }
}

fn destination(listener: &TcpListener) -> Destination {
    let port = listener.local_addr().expect("bound").port();
    resolve(&format!("http://127.0.0.1:{port}"), |_| None).expect("valid")
}

/// Reads one request; returns its path and body.
fn read_request(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("request line");
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).expect("header");
        if header.trim().is_empty() {
            break;
        }
        if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("body");
    (path, body)
}

/// Answers `statuses` in turn, then 200s; sends each accepted body on.
fn serve(listener: TcpListener, statuses: Vec<u16>, accepted: mpsc::Sender<(String, Vec<u8>)>) {
    thread::spawn(move || {
        let mut statuses = statuses.into_iter();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let (path, body) = read_request(&mut stream);
            let status = statuses.next().unwrap_or(200);
            let answer = match status {
                200 => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".to_string(),
                s => format!("HTTP/1.1 {s} No\r\nRetry-After: 0\r\nContent-Length: 4\r\n\r\nbusy"),
            };
            let _ = stream.write_all(answer.as_bytes());
            if status == 200 && accepted.send((path, body)).is_err() {
                break;
            }
        }
    });
}

#[test]
fn a_refused_request_is_retried_until_accepted_in_order() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dest = destination(&listener);
    let (tx, rx) = mpsc::channel();
    serve(listener, vec![503, 429, 502], tx);
    let exporter = Exporter::start(dest, fast()).expect("start");
    exporter.push(b"first".to_vec());
    exporter.push(b"second".to_vec());
    let got = [rx.recv().expect("first"), rx.recv().expect("second")];
    assert_eq!(
        got[0],
        ("/v1development/profiles".to_string(), b"first".to_vec())
    );
    assert_eq!(got[1].1, b"second");
    let last = Some(b"last".to_vec());
    let stats = exporter.finish(last, Duration::from_secs(5), Duration::from_secs(5), || {});
    assert_eq!(rx.recv().expect("last").1, b"last");
    assert_eq!(
        stats,
        Stats {
            sent: 3,
            failed: 3,
            dropped: 0,
            queued: 0
        }
    );
}

#[test]
fn a_status_that_is_not_retryable_drops_the_request() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dest = destination(&listener);
    let (tx, rx) = mpsc::channel();
    serve(listener, vec![400], tx);
    let exporter = Exporter::start(dest, fast()).expect("start");
    exporter.push(b"bad".to_vec());
    exporter.push(b"good".to_vec());
    assert_eq!(rx.recv().expect("accepted").1, b"good");
    let stats = exporter.finish(None, Duration::from_secs(5), Duration::from_secs(5), || {});
    assert_eq!((stats.sent, stats.failed, stats.dropped), (1, 1, 1));
}

#[test]
fn a_silent_collector_costs_the_end_its_wait_and_the_queue_stays_bounded() {
    // Connections complete in the kernel's backlog, nobody answers.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let exporter = Exporter::start(destination(&listener), fast()).expect("start");
    let pushes = 3 * QUEUE as u64;
    for i in 0..pushes {
        exporter.push(vec![0; 1000 + i as usize]);
        assert!(exporter.stats().queued <= QUEUE as u64);
    }
    let mut said = false;
    let last = Some(b"last".to_vec());
    let stats = exporter.finish(
        last,
        Duration::from_millis(300),
        Duration::from_millis(100),
        || {
            said = true;
        },
    );
    assert!(said, "a wait past the quiet time is said");
    // Every request is accounted for, the last one too; none delivered.
    assert_eq!(
        (stats.sent, stats.dropped, stats.queued),
        (0, pushes + 1, 0),
        "{stats:?}"
    );
    drop(listener);
}

#[test]
fn a_collector_that_is_down_fails_every_attempt_and_drops() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("bound").port()
    }; // closed: connections are refused
    let dest = resolve(&format!("http://127.0.0.1:{port}"), |_| None).expect("valid");
    let policy = Policy {
        attempts: 3,
        ..fast()
    };
    let exporter = Exporter::start(dest, policy).expect("start");
    exporter.push(b"x".to_vec());
    let stats = exporter.finish(None, Duration::from_secs(5), Duration::from_secs(5), || {});
    assert_eq!((stats.sent, stats.failed, stats.dropped), (0, 3, 1));
}
