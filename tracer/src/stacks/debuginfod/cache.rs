//! The download thread: the cache first, then the servers; every file
//! bounded in size and checked before it is used or kept.

use std::{
    fs::{self, File},
    io::{self, Read, Write as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{mpsc, Arc},
    time::SystemTime,
};

use debuginfod::{BuildId, HttpClient, HttpClientError, Readable};

use super::{Fetch, Settings, MAX_UNUSED_AGE};
use crate::stacks::{debug_files, roots::open_in_root};

/// A GET through ureq, with the settings' time bounds; a status that is
/// not 2xx is handed back as one (404: not on that server).
#[derive(Debug)]
pub(super) struct Http(ureq::Agent);

impl Http {
    pub(super) fn new(settings: &Settings) -> Http {
        let t = Some(settings.timeout);
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(t)
            .timeout_recv_response(t)
            .timeout_per_read(t)
            .timeout_global(Some(settings.maxtime))
            .build()
            .new_agent();
        Http(agent)
    }
}

/// A response body (ureq's reader has no Debug, which the trait asks).
struct Body(ureq::BodyReader<'static>);

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Body")
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl HttpClient for Http {
    fn get(&self, url: &str) -> Result<Box<dyn Readable>, HttpClientError> {
        let response = self
            .0
            .get(url)
            .call()
            .map_err(|e| HttpClientError::Other(Box::new(e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(HttpClientError::StatusCode(status));
        }
        Ok(Box::new(Body(response.into_body().into_reader())))
    }
}

/// Fetches each build id received until the sender is dropped, telling
/// `done` what became of it.
pub(super) fn work(
    client: &debuginfod::Client,
    settings: &Settings,
    requests: &mpsc::Receiver<Arc<str>>,
    done: &dyn Fn(Arc<str>, Fetch),
) {
    let ready = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&settings.cache_dir);
    if ready.is_ok() {
        clean(&settings.cache_dir);
    }
    for id in requests {
        let fetch = match &ready {
            Ok(()) => fetch(client, settings, &id),
            Err(e) => Fetch::Failed(format!(
                "cache directory {}: {e}",
                settings.cache_dir.display()
            )),
        };
        done(id, fetch);
    }
}

/// The cache's entry for `id`, else what the servers have.
fn fetch(client: &debuginfod::Client, settings: &Settings, id: &str) -> Fetch {
    // Our own hex of a build id: a file name, never a path.
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Fetch::Failed(format!("{id}: not a build id"));
    }
    let dir = settings.cache_dir.join(id);
    let path = dir.join("debuginfo");
    if let Ok(file) = open_in_root(None, &path, settings.max_bytes) {
        // Used: kept from MAX_UNUSED_AGE's clean for another while.
        let _ = file.set_modified(SystemTime::now());
        if let Ok(found) = debug_files::fetched(file, id) {
            return Fetch::Found(Arc::new(found));
        }
        let _ = fs::remove_file(&path);
    }
    let response = match client.fetch_debug_info(&BuildId::Formatted(id.into())) {
        Ok(Some(response)) => response,
        Ok(None) => return Fetch::NotFound,
        Err(e) => return Fetch::Failed(format!("{e:#}")),
    };
    let server = response.server_url.to_string();
    match keep(&dir, &path, response.data, id, settings.max_bytes) {
        Ok(found) => Fetch::Found(Arc::new(found)),
        Err(why) => Fetch::Failed(format!("{server}: build id {id}: {why}")),
    }
}

/// Writes what `data` holds to a new file in `dir`, at most `max_bytes`
/// of it, and puts it at `path` if it is the debug file of `id`.
pub(super) fn keep(
    dir: &Path,
    path: &Path,
    data: impl Read,
    id: &str,
    max: u64,
) -> Result<debug_files::DebugFile, String> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .or_else(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => Ok(()),
            _ => Err(e),
        })
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".debuginfo.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let result = write_bounded(&tmp, data, max)
        .map_err(|e| e.to_string())
        .and_then(|()| open_in_root(None, &tmp, max).map_err(|e| e.to_string()))
        .and_then(|file| debug_files::fetched(file, id).map_err(|e| e.to_string()))
        .and_then(|found| {
            fs::rename(&tmp, path).map_err(|e| e.to_string())?;
            Ok(found)
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Copies `data` into the new file `to` (never one that exists, never
/// through a symbolic link), failing past `max` bytes.
pub(super) fn write_bounded(to: &Path, data: impl Read, max: u64) -> io::Result<()> {
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(to)?;
    let copied = io::copy(&mut data.take(max.saturating_add(1)), &mut file)?;
    if copied > max {
        return Err(io::Error::other(format!("larger than {max} bytes")));
    }
    file.flush()
}

/// Removes the cache's entries unused for MAX_UNUSED_AGE, and downloads
/// left behind by a tracer that was killed (older than a day).
fn clean(cache_dir: &Path) {
    let Ok(entries) = fs::read_dir(cache_dir) else {
        return;
    };
    let old = |p: &PathBuf, age| {
        fs::symlink_metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|e| e > age)
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let hex = entry.file_name();
        let is_id = hex
            .to_str()
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        if !is_id || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let file = dir.join("debuginfo");
        if old(&file, MAX_UNUSED_AGE) {
            let _ = fs::remove_file(&file);
        }
        let Ok(inside) = fs::read_dir(&dir) else {
            continue;
        };
        for tmp in inside.flatten().map(|e| e.path()) {
            let stale = tmp.extension().is_some_and(|e| e == "tmp");
            if stale && old(&tmp, std::time::Duration::from_secs(24 * 3600)) {
                let _ = fs::remove_file(&tmp);
            }
        }
        // Only if empty.
        let _ = fs::remove_dir(&dir);
    }
}
