//! What both benches share: a child process whose output lines arrive on a
//! channel, the median of the rounds, and the numbers read from the
//! tracer's output.

use std::{
    io::{BufRead, BufReader, Write},
    path::Path,
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

/// Longest wait for a line of a child's output.
const LINE_TIMEOUT: Duration = Duration::from_secs(300);

/// The item whose key is the median of the keys (the upper one of the two
/// middle items of an even count), or None for no items.
pub(crate) fn median_by<T>(items: &[T], key: impl Fn(&T) -> f64) -> Option<&T> {
    let mut sorted: Vec<&T> = items.iter().collect();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted.get(sorted.len() / 2).copied()
}

/// The tracer's peak RSS from its --verbose line
/// "tracer CPU 0.383 s user, 0.082 s system; peak RSS 47924 KiB".
pub(crate) fn peak_rss_kib(stderr: &[String]) -> Option<u64> {
    let line = stderr.iter().find(|l| l.contains("tracer CPU"))?;
    let nums: Vec<f64> = line
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|w| w.parse().ok())
        .collect();
    match nums[..] {
        [_user, _sys, rss, ..] => Some(rss as u64),
        _ => None,
    }
}

/// The first integer after `key:` in a JSON text (the report's field names
/// are unique where used here, totals come before stacks).
pub(crate) fn json_u64(text: &str, key: &str) -> Option<u64> {
    let rest = &text[text.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A child whose stdout (target) or stderr (tracer) lines arrive on a channel.
pub(crate) struct Proc {
    pub(crate) child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    pub(crate) fn spawn(mut cmd: Command, stdout: bool) -> Result<Proc> {
        cmd.stdin(Stdio::piped());
        if stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        } else {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let pipe: Box<dyn std::io::Read + Send> = if stdout {
            Box::new(child.stdout.take().context("stdout")?)
        } else {
            Box::new(child.stderr.take().context("stderr")?)
        };
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok(Proc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        })
    }

    pub(crate) fn wait_line(&mut self, needle: &str) -> Result<String> {
        loop {
            let line = self
                .lines
                .recv_timeout(LINE_TIMEOUT)
                .with_context(|| format!("no line containing {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    pub(crate) fn send(&mut self, s: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin")?;
        stdin.write_all(s.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    pub(crate) fn rest(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `memtrace-bpf agent` running beside a run, its standby tracer's
/// programs loaded and nothing attached; killed when dropped.
pub(crate) struct IdleAgent {
    _agent: Proc,
}

impl IdleAgent {
    pub(crate) fn start(tracer: &Path, dir: &Path) -> Result<IdleAgent> {
        let socket = dir.join("agent/agent.sock");
        let mut cmd = Command::new(tracer);
        cmd.args(["agent", "--serve", "off", "--socket"])
            .arg(&socket)
            .arg("--dir")
            .arg(dir.join("agent/traces"));
        let mut agent = Proc::spawn(cmd, false)?;
        agent.wait_line("agent ready")?;
        let deadline = std::time::Instant::now() + LINE_TIMEOUT;
        while !get_unix(&socket, "/traces")?.contains("\"standby\": \"ready\"") {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the agent's standby tracer never got ready"
            );
            thread::sleep(Duration::from_millis(100));
        }
        Ok(IdleAgent { _agent: agent })
    }
}

/// One GET over a Unix socket; the whole answer.
pub(crate) fn get_unix(socket: &Path, path: &str) -> Result<String> {
    use std::io::Read as _;
    let mut stream = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connect {}", socket.display()))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_rss_comes_from_the_verbose_cpu_line() {
        let stderr = vec![
            "memtrace-bpf: tracing pid 1".to_string(),
            "memtrace-bpf: tracer CPU 0.383 s user, 0.082 s system; peak RSS 47924 KiB".to_string(),
        ];
        assert_eq!(peak_rss_kib(&stderr), Some(47924));
        assert_eq!(peak_rss_kib(&stderr[..1]), None);
        assert_eq!(
            json_u64(r#"{"alloc_objects": 12, "x": 3}"#, "\"alloc_objects\""),
            Some(12)
        );
    }

    #[test]
    fn median_by_takes_the_middle_key_and_the_upper_middle_of_an_even_count() {
        let odd = [(3.0, 'a'), (1.0, 'b'), (2.0, 'c')];
        assert_eq!(median_by(&odd, |x| x.0), Some(&(2.0, 'c')));
        let even = [(4.0, 'a'), (1.0, 'b'), (3.0, 'c'), (2.0, 'd')];
        assert_eq!(median_by(&even, |x| x.0), Some(&(3.0, 'c')));
        assert_eq!(median_by(&[] as &[(f64, char)], |x| x.0), None);
    }
}
