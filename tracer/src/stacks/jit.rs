//! Names of JIT code, from the files JITs write for perf: `/tmp/perf-PID.map`
//! (`perf_map.rs`) and jitdump files (`jitdump.rs`). Everything in them is
//! the traced process's, so hostile: files are opened inside the process's
//! root without following symlinks and read only if they are regular files
//! owned by the process's user; entries, name lengths and bytes read are
//! capped per process; what is kept for a process goes when it exits.
//!
//! ```ignore
//! let mut jit = JitSymbols::default();
//! if let Some((start, name)) = jit.lookup(pid, addr, modules.maps(pid)) { /* ... */ }
//! ```

mod entries;
mod jitdump;
mod perf_map;

use std::{
    collections::HashMap,
    ffi::CString,
    fs::File,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::fs::MetadataExt as _,
    },
    sync::Arc,
    time::{Duration, Instant},
};

use self::{entries::Entries, jitdump::DumpReader, perf_map::LineReader};
use crate::tracee::process::Mapping;

/// A process's files are read again at most this often when an address in
/// JIT code has no name yet (a JIT writes the name before running the code,
/// so a miss is either code not in any map or a line written since).
const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(100);
/// Bytes read from one process's files over the whole trace.
pub const MAX_BYTES_READ: u64 = 256 << 20;
/// Files per process (its perf map and jitdump files).
const MAX_SOURCES: usize = 4;
/// Paths tried per process (files refused included).
const MAX_TRIED: usize = 16;

enum Reader {
    PerfMap(LineReader),
    Dump(DumpReader),
}

struct Source {
    /// As the process sees it.
    path: String,
    file: File,
    reader: Reader,
}

/// Counts for `--verbose`, summed over processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JitStats {
    /// Files read (perf maps and jitdumps).
    pub files: u64,
    /// Files found but refused: not regular, not the process's user's, or
    /// reached through a symlink.
    pub refused: u64,
    /// Entries read.
    pub entries: u64,
    /// Lines or records that were not entries (bad hex, empty range).
    pub bad_lines: u64,
    /// Entries dropped because a process reached a cap (entries, name
    /// bytes, bytes read).
    pub capped: u64,
}

/// What is known of one process's JIT code; dropped with the process.
#[derive(Default)]
pub struct JitSymbols {
    sources: Vec<Source>,
    /// Paths tried already (found or refused), not opened again.
    tried: Vec<String>,
    entries: Entries,
    bytes_read: u64,
    last_read: Option<Instant>,
}

impl JitSymbols {
    /// The JIT entry covering `addr` in process `pid`: its start and name.
    /// Reads what the process's files gained since the last read when
    /// `addr` has no name yet (rate-limited). `maps`: its file mappings, in
    /// which jitdump files show.
    pub fn lookup(
        &mut self,
        pid: u32,
        addr: u64,
        maps: &[Mapping],
        stats: &mut JitStats,
    ) -> Option<(u64, &str)> {
        if self.entries.lookup(addr).is_none() {
            if self
                .last_read
                .is_some_and(|t| t.elapsed() < MIN_REREAD_INTERVAL)
            {
                return None;
            }
            self.read(pid, maps, stats);
        }
        self.entries.lookup(addr)
    }

    /// Opens files not opened yet and reads what every file gained.
    pub fn read(&mut self, pid: u32, maps: &[Mapping], stats: &mut JitStats) {
        self.last_read = Some(Instant::now());
        self.discover(pid, maps, stats);
        let mut budget = MAX_BYTES_READ - self.bytes_read.min(MAX_BYTES_READ);
        let before = budget;
        let JitSymbols {
            sources, entries, ..
        } = self;
        for s in sources.iter_mut() {
            let _ = match &mut s.reader {
                Reader::PerfMap(r) => r.read_new(&s.file, &mut budget, |line| {
                    match perf_map::parse_line(line) {
                        Some((start, end, name)) => add(entries, stats, start, end, &name),
                        None => stats.bad_lines += 1,
                    }
                }),
                Reader::Dump(r) => r.read_new(&s.file, &mut budget, |rec| match rec {
                    jitdump::Record::Load { start, size, name } => {
                        match start.checked_add(size).filter(|&e| e > start) {
                            Some(end) => add(entries, stats, start, end, &name),
                            None => stats.bad_lines += 1,
                        }
                    }
                    jitdump::Record::Move { from, to, size } => {
                        let name = entries.lookup(from).map(|(_, n)| n.to_string());
                        let end = to.checked_add(size).filter(|&e| e > to);
                        if let (Some(name), Some(end)) = (name, end) {
                            add(entries, stats, to, end, &name);
                        }
                    }
                }),
            };
        }
        self.bytes_read += before - budget;
    }

    /// Opens the process's perf map and the jitdump files it maps, once each.
    fn discover(&mut self, pid: u32, maps: &[Mapping], stats: &mut JitStats) {
        if self.sources.len() >= MAX_SOURCES || self.tried.len() >= MAX_TRIED {
            return;
        }
        let Some(ids) = ProcessIds::read(pid) else {
            return;
        };
        let mut wanted = vec![(format!("/tmp/perf-{}.map", ids.ns_pid), true)];
        for m in maps {
            if is_jitdump(&m.path) && !wanted.iter().any(|(p, _)| *p == m.path) {
                wanted.push((m.path.clone(), false));
            }
        }
        for (path, perf_map) in wanted {
            if self.sources.len() >= MAX_SOURCES
                || self.tried.len() >= MAX_TRIED
                || self.tried.contains(&path)
            {
                continue;
            }
            match open_in_root(pid, &path, ids.uid) {
                Opened::File(file) => {
                    stats.files += 1;
                    self.tried.push(path.clone());
                    let reader = if perf_map {
                        Reader::PerfMap(LineReader::default())
                    } else {
                        Reader::Dump(DumpReader::default())
                    };
                    self.sources.push(Source { path, file, reader });
                }
                Opened::Refused => {
                    stats.refused += 1;
                    self.tried.push(path);
                }
                Opened::Absent => {} // not written yet: tried again later
            }
        }
    }

    /// The files read, as the process sees them (for --verbose and tests).
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.sources.iter().map(|s| s.path.as_str())
    }

    /// Entries held.
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
}

fn add(entries: &mut Entries, stats: &mut JitStats, start: u64, end: u64, name: &str) {
    if entries.insert(start, end, name) {
        stats.entries += 1;
    } else {
        stats.capped += 1;
    }
}

/// `jit-<digits>.dump`, as perf's jvmti agent and V8 `--perf-prof` name them.
fn is_jitdump(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.strip_prefix("jit-")
        .and_then(|b| b.strip_suffix(".dump"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A process's pid in its own pid namespace (the last `NSpid` entry: the
/// perf map is named with it) and its effective uid.
struct ProcessIds {
    ns_pid: u32,
    uid: u32,
}

impl ProcessIds {
    fn read(pid: u32) -> Option<ProcessIds> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
        };
        let ns_pid = field("NSpid:")
            .and_then(|v| v.last()?.parse().ok())
            .unwrap_or(pid);
        let uid = field("Uid:")?.get(1)?.parse().ok()?;
        Some(ProcessIds { ns_pid, uid })
    }
}

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

enum Opened {
    File(File),
    /// There, but not to be read (not regular, not the process's user's,
    /// a symlink on the way).
    Refused,
    Absent,
}

/// Opens `path` as process `pid` sees it, resolved inside its root
/// (`RESOLVE_IN_ROOT`: an absolute symlink cannot lead out to the host's
/// files) without following any symlink (a symlink in /tmp must not make
/// the tracer read /etc/shadow), then checks what was opened (fstat): a
/// regular file owned by `uid`.
fn open_in_root(pid: u32, path: &str, uid: u32) -> Opened {
    let Ok(root) = File::open(format!("/proc/{pid}/root")) else {
        return Opened::Absent;
    };
    let Ok(rel) = CString::new(path.trim_start_matches('/')) else {
        return Opened::Refused;
    };
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 reads a NUL-terminated path and an open_how of the
    // size passed, both alive for the call; it returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ESRCH) => Opened::Absent,
            _ => Opened::Refused, // ELOOP (a symlink), EXDEV, EACCES...
        };
    }
    let Ok(fd) = i32::try_from(fd) else {
        return Opened::Refused;
    };
    // SAFETY: `fd` was just returned by openat2 and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    match file.metadata() {
        Ok(meta) if meta.file_type().is_file() && meta.uid() == uid => Opened::File(file),
        _ => Opened::Refused,
    }
}

/// Module ids from here up name JIT symbols (`JitNames`), not objects.
pub const JIT_MODULE: u32 = 1 << 31;
/// Names interned for frames over the whole trace (they outlive their
/// processes, as frames do): a cap on count and on bytes.
const MAX_INTERNED: usize = 1 << 20;
const MAX_INTERNED_BYTES: usize = 64 << 20;

/// The names of JIT frames that stacks hold, each once, for the whole
/// trace: a frame refers to its name by id (`JIT_MODULE + id`).
#[derive(Default)]
pub struct JitNames {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
    bytes: usize,
    /// Frames left unnamed because the caps were reached.
    pub refused: u64,
}

impl JitNames {
    /// The module id naming `name`; None past the caps.
    pub fn intern(&mut self, name: &str) -> Option<u32> {
        if let Some(&id) = self.ids.get(name) {
            return Some(JIT_MODULE + id);
        }
        if self.names.len() >= MAX_INTERNED || self.bytes + name.len() > MAX_INTERNED_BYTES {
            self.refused += 1;
            return None;
        }
        let id = self.names.len() as u32;
        let name: Arc<str> = name.into();
        self.bytes += name.len();
        self.names.push(name.clone());
        self.ids.insert(name, id);
        Some(JIT_MODULE + id)
    }

    /// The name a module id stands for, if it is a JIT name.
    pub fn get(&self, module: u32) -> Option<&str> {
        let id = module.checked_sub(JIT_MODULE)?;
        self.names.get(id as usize).map(|n| &**n)
    }
}

#[cfg(test)]
mod tests;
