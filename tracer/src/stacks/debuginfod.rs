//! Debug files fetched from debuginfod servers, as gdb and perf fetch
//! them: `DEBUGINFOD_URLS` lists the servers (space- or comma-separated),
//! a debug file is asked for by the build id of an object that has no
//! DWARF and no debug file found locally (`GET /buildid/ID/debuginfo`).
//!
//! What a server sends is as hostile as what a traced process writes: it
//! is read at most `min(DEBUGINFOD_MAXSIZE, 2 GiB)` bytes into a file of
//! the cache, used only if it is an ELF file of the build id asked for
//! with DWARF or symbols and no debug link (`debug_files::fetched`), and
//! each download is bounded in time (`DEBUGINFOD_TIMEOUT` to connect, to
//! the answer and per read; `DEBUGINFOD_MAXTIME` in all). Files found in
//! the cache are checked the same way each time they are used.
//!
//! Downloads run on one thread of their own, started at the first one
//! asked for: symbolization never waits for them during the trace (a
//! frame named while its debug file is on its way is named again at the
//! next snapshot, see `symbolize::Names`); the final report waits for
//! those still running at most `REPORT_WAIT` in total, and a signal ends
//! the wait at once (`wait`).
//!
//! State: one entry per build id asked for, at most `MAX_FETCHES` per
//! trace, each holding the debug file open once fetched; kept for the
//! whole trace (a file may be needed again at each snapshot). The cache
//! (`cache_dir`) keeps elfutils' layout, `DIR/BUILDID/debuginfo`; entries
//! unused for `MAX_UNUSED_AGE` are removed when a trace starts fetching.

mod cache;
#[cfg(test)]
mod tests;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{mpsc, Arc, Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::debug_files::{DebugFile, MAX_DEBUG_FILE_BYTES};

/// Most debug files asked for in one trace.
const MAX_FETCHES: usize = 64;
/// Longest the final report waits for downloads still running.
pub const REPORT_WAIT: Duration = Duration::from_secs(120);
/// Default of `DEBUGINFOD_TIMEOUT` (elfutils: 90 s): to connect, for the
/// answer, and for each read.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `DEBUGINFOD_MAXTIME` (elfutils: none): one whole download.
const DEFAULT_MAXTIME: Duration = Duration::from_secs(300);
/// Cache entries not used for this long are removed (elfutils' default
/// `max_unused_age_s`).
const MAX_UNUSED_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where and how to fetch, from the environment.
struct Settings {
    cache_dir: PathBuf,
    timeout: Duration,
    maxtime: Duration,
    max_bytes: u64,
}

/// What became of one build id asked for.
#[derive(Clone)]
enum Fetch {
    Pending,
    Found(Arc<DebugFile>),
    NotFound,
    Failed(String),
}

/// What symbolization gets for a build id.
pub enum Got {
    /// Still on its way.
    Pending,
    Found(Arc<DebugFile>),
    /// No server has it, it failed, or it was not asked for (the trace's
    /// cap was reached): counted in `Stats`.
    None,
}

/// What the trace's fetches came to, for the report's notes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub asked: u64,
    pub found: u64,
    pub not_found: u64,
    pub failed: u64,
    /// Still running when the report was made.
    pub unfinished: u64,
    /// Not asked: past MAX_FETCHES.
    pub over_cap: u64,
    /// One failure's words (a server's URL and error).
    pub example: Option<String>,
}

#[derive(Default)]
struct Fetches {
    by_id: HashMap<Arc<str>, Fetch>,
    over_cap: u64,
}

struct Shared {
    fetches: Mutex<Fetches>,
    changed: Condvar,
}

/// The trace's debuginfod client: its servers, its cache, its downloads.
pub struct Debuginfod {
    shared: Arc<Shared>,
    /// Until the thread is started: the client and settings it takes.
    idle: Mutex<Option<(debuginfod::Client, Settings)>>,
    requests: Mutex<Option<mpsc::Sender<Arc<str>>>>,
}

impl Debuginfod {
    /// The client `DEBUGINFOD_URLS` asks for, None when it is unset or
    /// empty. A URL that does not parse, or a cache directory that cannot
    /// be had, is an error that says which.
    pub fn from_env() -> anyhow::Result<Option<Debuginfod>> {
        let Some(urls) = std::env::var_os("DEBUGINFOD_URLS") else {
            return Ok(None);
        };
        let urls = urls.to_str().context(
            "DEBUGINFOD_URLS is not UTF-8: set it to space-separated http:// or https:// URLs",
        )?;
        let settings = Settings::from_env()?;
        let client = debuginfod::Client::builder()
            .http_client(cache::Http::new(&settings))
            .build(urls.split([' ', ',']).filter(|u| !u.trim().is_empty()))
            .context(
                "DEBUGINFOD_URLS: set it to space-separated http:// or https:// URLs, or unset it",
            )?;
        Ok(client.map(|client| Debuginfod {
            shared: Arc::new(Shared {
                fetches: Mutex::new(Fetches::default()),
                changed: Condvar::new(),
            }),
            idle: Mutex::new(Some((client, settings))),
            requests: Mutex::new(None),
        }))
    }

    /// The debug file of `build_id` (hex) if fetched; else asks for it
    /// (once per build id) and answers at once.
    pub fn get(&self, build_id: &Arc<str>) -> Got {
        let mut fetches = lock(&self.shared.fetches);
        match fetches.by_id.get(build_id) {
            Some(Fetch::Found(file)) => return Got::Found(file.clone()),
            Some(Fetch::Pending) => return Got::Pending,
            Some(Fetch::NotFound | Fetch::Failed(_)) => return Got::None,
            None => {}
        }
        if fetches.by_id.len() >= MAX_FETCHES {
            fetches.over_cap += 1;
            return Got::None;
        }
        if self.send(build_id.clone()) {
            fetches.by_id.insert(build_id.clone(), Fetch::Pending);
            Got::Pending
        } else {
            let why = "the download thread could not be started".to_string();
            fetches.by_id.insert(build_id.clone(), Fetch::Failed(why));
            Got::None
        }
    }

    /// Hands `build_id` to the download thread, started on first use.
    fn send(&self, build_id: Arc<str>) -> bool {
        let mut requests = lock(&self.requests);
        if requests.is_none() {
            let Some((client, settings)) = lock(&self.idle).take() else {
                return false;
            };
            let (tx, rx) = mpsc::channel();
            let shared = self.shared.clone();
            let started = std::thread::Builder::new()
                .name("debuginfod".into())
                .spawn(move || {
                    cache::work(&client, &settings, &rx, &|id, fetch| {
                        lock(&shared.fetches).by_id.insert(id, fetch);
                        shared.changed.notify_all();
                    })
                });
            if started.is_err() {
                return false;
            }
            *requests = Some(tx);
        }
        requests
            .as_ref()
            .is_some_and(|tx| tx.send(build_id).is_ok())
    }

    /// Whether a download is still running.
    pub fn pending(&self) -> bool {
        let fetches = lock(&self.shared.fetches);
        fetches.by_id.values().any(|f| matches!(f, Fetch::Pending))
    }

    /// Waits until no download runs, `until` passes or `interrupted` says
    /// a signal came (looked at every 100 ms). True if none runs.
    pub fn wait(&self, until: Instant, interrupted: fn() -> bool) -> bool {
        let mut fetches = lock(&self.shared.fetches);
        loop {
            if !fetches.by_id.values().any(|f| matches!(f, Fetch::Pending)) {
                return true;
            }
            let now = Instant::now();
            if now >= until || interrupted() {
                return false;
            }
            let slice = (until - now).min(Duration::from_millis(100));
            fetches = match self.shared.changed.wait_timeout(fetches, slice) {
                Ok((guard, _)) => guard,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    pub fn stats(&self) -> Stats {
        let fetches = lock(&self.shared.fetches);
        let mut stats = Stats {
            asked: fetches.by_id.len() as u64,
            over_cap: fetches.over_cap,
            ..Stats::default()
        };
        for fetch in fetches.by_id.values() {
            match fetch {
                Fetch::Pending => stats.unfinished += 1,
                Fetch::Found(_) => stats.found += 1,
                Fetch::NotFound => stats.not_found += 1,
                Fetch::Failed(why) => {
                    stats.failed += 1;
                    if stats.example.is_none() {
                        stats.example = Some(crate::escape::text(why).into_owned());
                    }
                }
            }
        }
        stats
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Settings {
    /// elfutils' variables: `DEBUGINFOD_CACHE_PATH`, `DEBUGINFOD_TIMEOUT`
    /// (seconds), `DEBUGINFOD_MAXTIME` (seconds), `DEBUGINFOD_MAXSIZE`
    /// (bytes, at most 2 GiB here).
    fn from_env() -> anyhow::Result<Settings> {
        let secs = |name: &str, default: Duration| -> anyhow::Result<Duration> {
            match std::env::var(name) {
                Ok(v) if !v.trim().is_empty() => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&s| s > 0)
                    .map(Duration::from_secs)
                    .with_context(|| {
                        format!("{name} must be a whole number of seconds, above 0, or unset")
                    }),
                _ => Ok(default),
            }
        };
        let max_bytes = match std::env::var("DEBUGINFOD_MAXSIZE") {
            Ok(v) if !v.trim().is_empty() => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&b| b > 0)
                .context("DEBUGINFOD_MAXSIZE must be a number of bytes, above 0, or unset")?
                .min(MAX_DEBUG_FILE_BYTES),
            _ => MAX_DEBUG_FILE_BYTES,
        };
        let cache_dir = cache_dir().context(
            "no cache directory for debuginfod: set DEBUGINFOD_CACHE_PATH, XDG_CACHE_HOME or HOME",
        )?;
        Ok(Settings {
            // Absolute: files in it are opened from / (`open_in_root`).
            cache_dir: std::path::absolute(&cache_dir)
                .with_context(|| format!("debuginfod cache {}", cache_dir.display()))?,
            timeout: secs("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT)?,
            maxtime: secs("DEBUGINFOD_MAXTIME", DEFAULT_MAXTIME)?,
            max_bytes,
        })
    }
}

/// `DEBUGINFOD_CACHE_PATH`; else /var/cache/memtrace-bpf/debuginfod for
/// root, `$XDG_CACHE_HOME/memtrace-bpf/debuginfod` or
/// `~/.cache/memtrace-bpf/debuginfod` for others.
fn cache_dir() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("DEBUGINFOD_CACHE_PATH") {
        return Some(dir.into());
    }
    // SAFETY: geteuid cannot fail and touches no memory.
    let base = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/cache")
    } else if let Some(xdg) = var("XDG_CACHE_HOME") {
        PathBuf::from(xdg)
    } else {
        PathBuf::from(var("HOME")?).join(".cache")
    };
    Some(base.join("memtrace-bpf/debuginfod"))
}
