//! The redis-server under benchmark and the redis-benchmark client that
//! loads it.

use std::{
    fs::{self, File},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{cmd::output_timeout, cpu::pinned};

pub(super) const REDIS_SERVER: &str = "/usr/bin/redis-server";
const REDIS_CLI: &str = "/usr/bin/redis-cli";
const REDIS_BENCHMARK: &str = "/usr/bin/redis-benchmark";
/// Keys are drawn from this many, so SET keeps adding keys (memory grows).
pub(super) const KEYSPACE: u32 = 100_000;
pub(super) const VALUE_BYTES: u32 = 100;
/// redis-benchmark's default number of parallel connections.
pub(super) const CLIENTS: u32 = 50;
/// Any one command; a traced run may be many times slower than untraced.
const TIMEOUT: Duration = Duration::from_secs(600);

/// A redis-server on a free local port without persistence; killed on drop.
pub(super) struct Redis {
    pub(super) child: Child,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    pub(super) fn start(dir: &Path, cpu: Option<&str>) -> Result<Redis> {
        if !Path::new(REDIS_SERVER).exists() {
            bail!("{REDIS_SERVER} is missing: `cargo xtask setup` installs it");
        }
        fs::create_dir_all(dir)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = File::create(dir.join("redis.log"))?;
        let child = pinned(REDIS_SERVER, cpu)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?;
        let mut redis = Redis {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = redis.child.try_wait()? {
                bail!("redis-server exited ({status}): {}", redis.log());
            }
            if redis.cli(&["PING"]).is_ok_and(|r| r == "PONG") {
                return Ok(redis);
            }
            if Instant::now() > deadline {
                bail!("redis-server did not answer PING in 15 s: {}", redis.log());
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    pub(super) fn cli(&self, args: &[&str]) -> Result<String> {
        let out = output_timeout(
            Command::new(REDIS_CLI)
                .args(["-p", &self.port.to_string()])
                .args(args),
            Duration::from_secs(30),
        )?;
        if !out.status.success() {
            bail!(
                "redis-cli {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// One redis-benchmark run: (SET, GET) requests per second.
    pub(super) fn benchmark(&self, cpu: Option<&str>, requests: u32) -> Result<(f64, f64)> {
        let out = output_timeout(
            pinned(REDIS_BENCHMARK, cpu)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-q", "--csv", "-t", "set,get"])
                .args(["-n", &requests.to_string()])
                .args(["-c", &CLIENTS.to_string()])
                .args(["-d", &VALUE_BYTES.to_string()])
                .args(["-r", &KEYSPACE.to_string()]),
            TIMEOUT,
        )?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "redis-benchmark failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // "test","rps",... then e.g. "SET","105485.23",...
        let rps = |test: &str| -> Option<f64> {
            stdout.lines().find_map(|l| {
                let mut cols = l.split(',').map(|c| c.trim_matches('"'));
                (cols.next()? == test).then(|| cols.next()?.parse().ok())?
            })
        };
        match (rps("SET"), rps("GET")) {
            (Some(set), Some(get)) => Ok((set, get)),
            _ => bail!("unexpected redis-benchmark output: {stdout}"),
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
