//! `memtrace-bpf --agent ADDR --pid N -d 30 ...`: the usual command line,
//! run as a trace of a running agent (its Unix socket, or HOST:PORT). The
//! trace is asked for, waited on (Ctrl-C, SIGTERM or SIGHUP ends it early,
//! and its final profile is still fetched), and its profile written where
//! -o says, in -f's format. A small blocking HTTP/1.1 client, every read
//! bounded.

use std::{
    io::{Read as _, Write as _},
    sync::atomic::{AtomicI32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

pub use crate::cli::AgentAddress as Address;
use crate::cli::Cli;

/// Largest answer read (a profile): 1 GiB.
const MAX_ANSWER: u64 = 1 << 30;
/// How often the trace's state is asked.
const POLL: Duration = Duration::from_millis(250);
/// Without -d: the agent's default.
const DEFAULT_SECONDS: f64 = 30.0;

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::Relaxed);
}

/// One request; the status and body of the answer.
pub fn request(
    to: &Address,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> anyhow::Result<(u16, Vec<u8>)> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: memtrace-bpf-agent\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.map_or(0, <[u8]>::len)
    );
    let mut raw = Vec::new();
    let connect_error = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot reach the agent at {} ({e}): is `memtrace-bpf agent` running? (the socket is \
             root's only)",
            to.show()
        )
    };
    match to {
        Address::Unix(p) => {
            let mut s = std::os::unix::net::UnixStream::connect(p).map_err(connect_error)?;
            s.write_all(head.as_bytes())?;
            s.write_all(body.unwrap_or_default())?;
            s.take(MAX_ANSWER).read_to_end(&mut raw)?;
        }
        Address::Tcp(a) => {
            let mut s = std::net::TcpStream::connect(a).map_err(connect_error)?;
            s.write_all(head.as_bytes())?;
            s.write_all(body.unwrap_or_default())?;
            s.take(MAX_ANSWER).read_to_end(&mut raw)?;
        }
    }
    parse_answer(&raw)
}

/// Status line, headers, then a body whole or chunked.
fn parse_answer(raw: &[u8]) -> anyhow::Result<(u16, Vec<u8>)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the agent's answer is not HTTP")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("the agent's answer has no status")?;
    let body = &raw[end + 4..];
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((
        status,
        if chunked {
            dechunk(body)?
        } else {
            body.to_vec()
        },
    ))
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk without its size")?;
        let size = std::str::from_utf8(&body[..line_end])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).context("a chunk cut short")?);
        body = body.get(size + 2..).context("a chunk cut short")?;
    }
}

/// The flags a trace through the agent takes; the error says which one
/// it does not.
fn trace_body(cli: &Cli) -> anyhow::Result<serde_json::Value> {
    let local_only = [
        (!cli.command.is_empty(), "a command (`-- CMD`)"),
        (cli.serve.is_some(), "--serve"),
        (cli.otlp.is_some(), "--otlp"),
        (cli.follow_forks, "--follow-forks"),
        (cli.comm.is_some(), "--comm"),
        (!cli.exclude_pid.is_empty(), "--exclude-pid"),
        (cli.snapshot_on_peak.is_some(), "--snapshot-on-peak"),
    ];
    if let Some((_, flag)) = local_only.iter().find(|(set, _)| *set) {
        bail!("{flag} is not taken through --agent: run the trace without --agent for it");
    }
    let mut body = serde_json::json!({
        "seconds": cli.duration.unwrap_or(DEFAULT_SECONDS),
        "sample_rate": cli.sample_rate,
    });
    match (cli.pid, &cli.binary, &cli.cgroup) {
        (Some(pid), _, _) => body["pid"] = pid.into(),
        (_, Some(binary), _) => body["binary"] = binary.to_string_lossy().into(),
        (_, _, Some(cgroup)) => body["cgroup"] = cgroup.to_string_lossy().into(),
        _ => bail!("--agent traces a --pid, --binary or --cgroup (not the whole host)"),
    }
    if let Some(interval) = cli.interval {
        body["interval"] = interval.into();
    }
    if let Some(age) = cli.min_age {
        body["min_age"] = age.into();
    }
    Ok(body)
}

/// Runs the trace through the agent at `to`; the exit status.
pub fn run(cli: &Cli, to: &Address) -> anyhow::Result<u8> {
    let body = trace_body(cli)?;
    let (status, answer) = request(to, "POST", "/traces", Some(body.to_string().as_bytes()))?;
    if status != 201 {
        bail!("the agent refused the trace ({status}): {}", text(&answer));
    }
    let started: serde_json::Value = serde_json::from_slice(&answer)?;
    let id = started["id"]
        .as_u64()
        .context("the agent gave no trace id")?;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    crate::console::say(format_args!(
        "tracing {} through the agent at {} (trace {id}); Ctrl-C ends it early",
        crate::escape::text(started["target"].as_str().unwrap_or("?")),
        to.show()
    ));
    let began = Instant::now();
    let mut asked_to_end = false;
    let state = loop {
        if !asked_to_end && SIGNAL.load(Ordering::Relaxed) != 0 {
            request(to, "DELETE", &format!("/traces/{id}"), None)?;
            asked_to_end = true;
        }
        std::thread::sleep(POLL);
        let (status, answer) = request(to, "GET", &format!("/traces/{id}"), None)?;
        if status != 200 {
            bail!("the agent lost trace {id} ({status}): {}", text(&answer));
        }
        let now: serde_json::Value = serde_json::from_slice(&answer)?;
        if now["state"] != "running" {
            break now;
        }
    };
    if state["state"] == "failed" {
        bail!(
            "trace {id} failed: {}",
            crate::escape::text(state["error"].as_str().unwrap_or("no message"))
        );
    }
    let format = <crate::report::Format as clap::ValueEnum>::to_possible_value(&cli.format)
        .map(|v| v.get_name().to_string())
        .unwrap_or_else(|| "text".into());
    let (status, profile) = request(to, "GET", &format!("/traces/{id}?format={format}"), None)?;
    if status != 200 {
        bail!(
            "the agent gave no profile for trace {id} ({status}): {}",
            text(&profile)
        );
    }
    let written = match &cli.output {
        Some(path) => {
            std::fs::write(path, &profile)
                .with_context(|| format!("writing {}", crate::escape::path(path)))?;
            format!("; report written to {}", crate::escape::path(path))
        }
        None => {
            std::io::stdout().write_all(&profile)?;
            String::new()
        }
    };
    let ended = if asked_to_end { "ended early" } else { "done" };
    crate::console::say(format_args!(
        "trace {id} through the agent {ended} after {:.1} s{written}",
        began.elapsed().as_secs_f64()
    ));
    Ok(0)
}

/// An error body, escaped and bounded.
fn text(body: &[u8]) -> String {
    let cut = &body[..body.len().min(2048)];
    crate::escape::bytes(cut.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_whole_and_chunked_are_read() {
        let whole = b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_answer(whole).unwrap(), (201, b"{}".to_vec()));
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_answer(chunked).unwrap(), (200, b"abcde".to_vec()));
        assert!(parse_answer(b"garbage").is_err());
        assert!(
            parse_answer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab").is_err()
        );
    }
}
