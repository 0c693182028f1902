//! `memtrace-bpf agent`: a host agent that attaches nothing until asked.
//! It serves an HTTP API (api.rs) on loopback and on a Unix socket only
//! root may open; each trace asked for runs as a tracer process of its own
//! (jobs.rs). `--agent ADDR` on the trace's command line runs a trace
//! through it (client.rs). docs/agent.md.

use std::{
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use clap::Parser as _;

pub mod api;
mod child;
pub mod client;
mod jobs;
mod listen;
mod log_tail;
mod reports;
pub mod request;
mod spare;
pub mod standby;
mod trace_files;
pub mod triggers;
mod watcher;

/// Where the Unix socket is unless --socket says.
pub const DEFAULT_SOCKET: &str = "/run/memtrace-bpf/agent.sock";
/// The traces' snapshots and logs, unless --dir says.
const DEFAULT_DIR: &str = "/run/memtrace-bpf/traces";
/// How often ended traces are reaped and old snapshots removed.
const SWEEP: Duration = Duration::from_secs(1);
/// How long traces get to write their profiles when the agent stops.
const STOP_GRACE: Duration = Duration::from_secs(20);

/// Run the host agent: nothing is attached until a trace is asked for
/// through its API (docs/agent.md).
#[derive(Debug, clap::Parser)]
#[command(name = "memtrace-bpf agent", bin_name = "memtrace-bpf agent")]
pub struct AgentCli {
    /// The API's TCP address (HOST:PORT; "off" for none). Loopback only
    /// unless --allow-remote.
    #[arg(long, default_value = "127.0.0.1:6060", value_name = "HOST:PORT")]
    pub serve: String,

    /// The API's Unix socket, made mode 0600 (root only) in a directory
    /// made 0700.
    #[arg(long, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub socket: PathBuf,

    /// Where the traces write their profiles (made 0700).
    #[arg(long, default_value = DEFAULT_DIR, value_name = "PATH")]
    pub dir: PathBuf,

    /// Most traces running at once; a request beyond gets 429.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub max_traces: usize,

    /// Most processes the running traces may cover together, counted when
    /// each starts (a cgroup's processes; one for a pid or a program); a
    /// trace beyond is refused with 429, a trigger's counted as skipped.
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_processes: usize,

    /// Let --serve listen on an address other hosts reach: anyone who
    /// reaches it can start traces that read any process's stacks.
    #[arg(long)]
    pub allow_remote: bool,

    /// Start a trace when memory misbehaves (repeatable): e.g.
    /// 'cgroup=/system.slice/x.service memory>2G', 'pid=4242
    /// growth>50M/30s', 'cgroup=/x events', 'cgroup=/x psi-some>150ms/1s'
    /// (docs/agent.md#triggers).
    #[arg(long, value_name = "TRIGGER")]
    pub trigger: Vec<String>,

    /// A file of triggers, one per line (# starts a comment).
    #[arg(long, value_name = "FILE")]
    pub triggers: Option<PathBuf>,

    /// Where triggered traces' reports go (made 0700).
    #[arg(
        long,
        default_value = "/var/lib/memtrace-bpf/reports",
        value_name = "DIR"
    )]
    pub reports: PathBuf,

    /// Most triggered reports kept; the oldest are removed first.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_reports: usize,

    /// Push the profiles of triggered traces to an OpenTelemetry collector
    /// as the tracer's --otlp does (URL, or its OTEL_EXPORTER_OTLP_*
    /// variables without one).
    #[arg(long, value_name = "URL", num_args = 0..=1, default_missing_value = "")]
    pub otlp: Option<String>,
}

/// Every trigger of the command line and of --triggers FILE, read.
fn triggers(cli: &AgentCli) -> anyhow::Result<Vec<triggers::Trigger>> {
    let mut lines: Vec<(String, String)> = cli
        .trigger
        .iter()
        .map(|t| ("--trigger".to_string(), t.clone()))
        .collect();
    if let Some(file) = &cli.triggers {
        let text = crate::tracee::elf::read_bounded(file, 1 << 20)
            .with_context(|| format!("--triggers {}", crate::escape::path(file)))?;
        for (n, line) in String::from_utf8_lossy(&text).lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if !line.is_empty() {
                lines.push((format!("{}:{}", file.display(), n + 1), line.to_string()));
            }
        }
    }
    if lines.len() > 256 {
        anyhow::bail!("at most 256 triggers, got {}", lines.len());
    }
    lines
        .into_iter()
        .map(|(at, line)| {
            triggers::Trigger::parse(&line)
                .map_err(|e| anyhow::anyhow!("{}: {e}", crate::escape::text(&at)))
        })
        .collect()
}

/// `memtrace-bpf agent ...`: `args` from "agent" on.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
    let cli = match AgentCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A bad flag or trigger fails the same way at every start: status 2,
    // which the unit does not restart.
    let (tcp, triggers) = match check(&cli) {
        Ok(checked) => checked,
        Err(e) => {
            crate::console::error(crate::escape::text(&format!("{e:#}")));
            return ExitCode::from(2);
        }
    };
    match run(&cli, tcp, triggers) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            crate::console::error(crate::escape::text(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// The flags and triggers, checked before anything starts.
fn check(cli: &AgentCli) -> anyhow::Result<(Option<SocketAddr>, Vec<triggers::Trigger>)> {
    if !(1..=64).contains(&cli.max_traces) {
        anyhow::bail!("--max-traces takes 1 to 64, got {}", cli.max_traces);
    }
    if !(1..=65536).contains(&cli.max_processes) {
        anyhow::bail!(
            "--max-processes takes 1 to 65536, got {}",
            cli.max_processes
        );
    }
    if let Some(url) = &cli.otlp {
        crate::otlp::destination(url)?;
    }
    Ok((tcp_address(cli)?, triggers(cli)?))
}

fn tcp_address(cli: &AgentCli) -> anyhow::Result<Option<SocketAddr>> {
    if cli.serve == "off" {
        return Ok(None);
    }
    let addr = crate::cli::parse_addr(&cli.serve).map_err(|e| anyhow::anyhow!("agent {e}"))?;
    if !addr.ip().is_loopback() {
        if !cli.allow_remote {
            anyhow::bail!(
                "--serve {addr} is not a loopback address: anyone who reaches it could start \
                 traces that read any process's stacks; use 127.0.0.1, the Unix socket, or add \
                 --allow-remote behind a firewall"
            );
        }
        crate::console::warn(format_args!(
            "--serve {addr} is not a loopback address (--allow-remote): anyone who reaches it \
             can start traces that read any process's stacks and command lines"
        ));
    }
    Ok(Some(addr))
}

fn run(
    cli: &AgentCli,
    tcp: Option<SocketAddr>,
    triggers: Vec<triggers::Trigger>,
) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("the agent starts traces that load BPF programs: run it as root");
    }
    private_dir(&cli.dir)?;
    if !triggers.is_empty() {
        private_dir(&cli.reports)?;
    }
    let exe = std::env::current_exe().context("finding the tracer's own binary")?;
    let agent = Arc::new(api::Agent {
        jobs: Mutex::new(jobs::Jobs::new(
            cli.dir.clone(),
            exe,
            cli.max_traces,
            cli.max_processes,
        )),
        triggers: Mutex::new(Vec::new()),
        otlp: cli.otlp.clone(),
    });
    let watching = match triggers.is_empty() {
        true => None,
        false => {
            let reports = reports::Reports::new(cli.reports.clone(), cli.max_reports.max(1));
            let (watcher, thread) = watcher::start(triggers, agent.clone(), reports)
                .context("starting the triggers' thread")?;
            Some((watcher, thread))
        }
    };
    // One thread: the traces' pdeathsig is tied to the thread that
    // started them (jobs.rs); rendering goes to blocking threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()
        .context("starting the agent's runtime")?;
    let result = runtime.block_on(async {
        let unix = bind_socket(&cli.socket)?;
        let tcp = match tcp {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("--serve {addr}: cannot listen"))?,
            ),
            None => None,
        };
        let shown = tcp
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .map(|a| format!("http://{a}/ and "))
            .unwrap_or_default();
        crate::console::say(format_args!(
            "agent ready: {shown}{} (nothing attached until a trace is asked for)",
            crate::escape::path(&cli.socket)
        ));
        // Traces that ended are reaped, and old snapshots removed, even
        // when no one asks.
        let sweeper = agent.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP);
            loop {
                every.tick().await;
                sweeper.jobs().sweep();
            }
        });
        listen::serve(api::router(agent.clone()), tcp, unix).await
    });
    let _ = std::fs::remove_file(&cli.socket);
    agent.jobs().stop_all(STOP_GRACE);
    if let Some((watcher, thread)) = watching {
        // Saves the reports of the traces just ended.
        watcher.stop();
        let _ = thread.join();
    }
    result
}

/// `dir`, made 0700 if missing; refused if another user owns it or
/// others may write to it.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("making {}", crate::escape::path(dir)))?;
    }
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("reading {}", crate::escape::path(dir)))?;
    use std::os::unix::fs::MetadataExt as _;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} must be a directory root owns that no one else may write to",
            crate::escape::path(dir)
        );
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} root's only", crate::escape::path(dir)))
}

/// The Unix socket, mode 0600 in a 0700 directory: only root connects.
/// A socket left by an agent that died is replaced; any other file there
/// is refused.
fn bind_socket(path: &Path) -> anyhow::Result<tokio::net::UnixListener> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        private_dir(parent)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "--socket {}: a file that is not a socket is there",
                crate::escape::path(path)
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "--socket {}: an agent already listens there",
                crate::escape::path(path)
            );
        }
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("--socket {}: cannot listen", crate::escape::path(path)))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}
