//! One HTTP/1.1 POST over a std `TcpStream`, every step bounded by a
//! deadline: what the exporter's thread needs, and no more (no TLS, no
//! keep-alive: a push every few seconds at most does not need them).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::endpoint::Destination;

/// Response headers are read up to this size, and the body up to
/// `MAX_BODY`: a collector's answer is a few bytes, and a misbehaving
/// server cannot make us hold more.
const MAX_HEAD: usize = 16 << 10;
const MAX_BODY: usize = 64 << 10;

/// A collector's answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// `Retry-After` in seconds (an HTTP date is not read).
    pub retry_after: Option<Duration>,
    /// The start of the body (`MAX_BODY` bytes at most).
    pub body: Vec<u8>,
}

/// POSTs `body` as `application/x-protobuf` to `dest`, giving up at
/// `deadline` (connecting, writing and reading all count).
pub fn post(dest: &Destination, body: &[u8], deadline: Instant) -> io::Result<Reply> {
    let mut stream = connect(dest, deadline)?;
    let mut head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: memtrace-bpf/{}\r\n\
         Content-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n",
        dest.path,
        dest.authority,
        env!("CARGO_PKG_VERSION"),
        body.len()
    );
    for (key, value) in &dest.headers {
        head.push_str(&format!("{key}: {value}\r\n"));
    }
    head.push_str("\r\n");
    set_timeouts(&stream, deadline)?;
    stream.write_all(head.as_bytes())?;
    // In pieces, so the deadline is checked between them.
    for chunk in body.chunks(256 << 10) {
        set_timeouts(&stream, deadline)?;
        stream.write_all(chunk)?;
    }
    stream.flush()?;
    read_reply(&mut stream, deadline)
}

fn connect(dest: &Destination, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} has no address", dest.host),
    );
    for addr in (dest.host.as_str(), dest.port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, remaining(deadline)?) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The time left before `deadline`, or a timeout error when none is.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(left) if !left.is_zero() => Ok(left),
        _ => Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

fn set_timeouts(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = remaining(deadline)?;
    stream.set_read_timeout(Some(left))?;
    stream.set_write_timeout(Some(left))
}

fn read_reply(stream: &mut impl ReadWithDeadline, deadline: Instant) -> io::Result<Reply> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("response headers too long"));
        }
        let n = stream.read_before(&mut chunk, deadline)?;
        if n == 0 {
            return Err(bad("connection closed before a complete response"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut reply = parse_head(&head)?;
    let length = header(&head, "content-length").and_then(|v| v.parse::<usize>().ok());
    let want = length.unwrap_or(MAX_BODY).min(MAX_BODY);
    let mut body = buf.split_off(head_end);
    while body.len() < want {
        match stream.read_before(&mut chunk, deadline) {
            Ok(0) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            // The status is what matters; a body cut short is kept as is.
            Err(_) => break,
        }
    }
    body.truncate(want);
    reply.body = body;
    Ok(reply)
}

/// A stream whose reads stop at a deadline (a trait so tests can feed a
/// reply from memory).
trait ReadWithDeadline {
    fn read_before(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<usize>;
}

impl ReadWithDeadline for TcpStream {
    fn read_before(&mut self, buf: &mut [u8], deadline: Instant) -> io::Result<usize> {
        set_timeouts(self, deadline)?;
        self.read(buf)
    }
}

impl ReadWithDeadline for &[u8] {
    fn read_before(&mut self, buf: &mut [u8], _deadline: Instant) -> io::Result<usize> {
        self.read(buf)
    }
}

/// The status line and `Retry-After`.
fn parse_head(head: &str) -> io::Result<Reply> {
    let status_line = head.lines().next().unwrap_or("");
    let mut words = status_line.split_whitespace();
    let status = match (words.next(), words.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .filter(|s| (100..1000).contains(s))
    .ok_or_else(|| bad("not an HTTP/1 response"))?;
    let retry_after = header(head, "retry-after")
        .and_then(|v| v.parse::<u64>().ok())
        .map(Duration::from_secs);
    Ok(Reply {
        status,
        retry_after,
        body: Vec::new(),
    })
}

/// The value of header `name` (lower case), trimmed.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(raw: &str) -> io::Result<Reply> {
        let deadline = Instant::now() + Duration::from_secs(1);
        read_reply(&mut raw.as_bytes(), deadline)
    }

    #[test]
    fn a_reply_gives_its_status_retry_after_and_body() {
        let r = reply(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 3\r\n\r\nabcdef",
        )
        .expect("parses");
        assert_eq!(
            r,
            Reply {
                status: 503,
                retry_after: Some(Duration::from_secs(2)),
                body: b"abc".to_vec()
            }
        );
        let r = reply("HTTP/1.0 200 OK\r\nretry-after: Fri, 31 Dec 1999 23:59:59 GMT\r\n\r\nx")
            .expect("parses");
        assert_eq!(
            (r.status, r.retry_after, r.body.as_slice()),
            (200, None, &b"x"[..])
        );
    }

    #[test]
    fn what_is_not_http_is_an_error() {
        assert!(reply("SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(
            reply("HTTP/1.1 200 OK\r\n").is_err(),
            "closed before the headers end"
        );
        assert!(reply(&"x".repeat(MAX_HEAD + 5000)).is_err());
    }
}
