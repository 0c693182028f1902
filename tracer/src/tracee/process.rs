//! The process being traced: validation, its memory map, and where its
//! allocator lives. Paths are resolved through /proc/PID/root so that
//! processes in other mount namespaces (containers) work.

use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::error::TraceError;

mod maps;

use maps::parse_maps_line;
pub use maps::{parse_jit, parse_maps, parse_maps_files, strip_deleted, Mapping};

/// PF_KTHREAD in include/linux/sched.h: the task is a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// A process we are about to trace.
#[derive(Debug)]
pub struct Process {
    /// Command line, arguments joined with spaces.
    pub command: String,
    pub mappings: Vec<Mapping>,
    /// Its anonymous executable mappings (JIT code): `parse_jit`.
    pub jit: Vec<std::ops::Range<u64>>,
}

impl Process {
    /// Checks that `pid` is a live user process and reads its maps.
    pub fn inspect(pid: u32) -> Result<Process, TraceError> {
        if pid == 0 {
            return Err(TraceError::PidZero);
        }
        if pid == std::process::id() {
            return Err(TraceError::SelfPid(pid));
        }
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        // Its name (field 2) need not be UTF-8.
        let stat = fs::read(proc_dir.join("stat")).map_err(|e| unreadable(pid, "stat", &e))?;
        let stat = String::from_utf8_lossy(&stat);
        if is_kernel_thread(&stat) {
            return Err(TraceError::KernelThread(pid));
        }
        if is_zombie(&stat) {
            return Err(TraceError::Zombie(pid));
        }
        let maps = fs::read(proc_dir.join("maps")).map_err(|e| unreadable(pid, "maps", &e))?;
        let mappings = parse_maps(&maps);
        if mappings.is_empty() && maps.is_empty() {
            // Readable but empty: it exited meanwhile, or is exiting.
            return Err(unreadable(
                pid,
                "maps",
                &std::io::ErrorKind::NotFound.into(),
            ));
        }
        Ok(Process {
            command: read_cmdline(pid),
            mappings,
            jit: parse_jit(&maps),
        })
    }
}

/// Why /proc/PID/`what` could not be read, as the user can act on it.
pub fn unreadable(pid: u32, what: &str, err: &std::io::Error) -> TraceError {
    let stat = read_stat(pid);
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => TraceError::Unreadable {
            pid,
            what: what.to_string(),
            reason: err.to_string(),
        },
        _ if stat.as_deref().is_some_and(is_zombie) => TraceError::Zombie(pid),
        _ if stat.is_some() && err.kind() != std::io::ErrorKind::NotFound => {
            TraceError::Unreadable {
                pid,
                what: what.to_string(),
                reason: err.to_string(),
            }
        }
        _ if stat.is_some() => TraceError::Zombie(pid),
        _ => TraceError::NoSuchProcess(pid),
    }
}

/// /proc/PID/stat's text, if the process still exists.
pub fn read_stat(pid: u32) -> Option<String> {
    // Bytes: the command name (field 2) is the program's file name, which
    // need not be UTF-8; the fields after it always are.
    let raw = fs::read(format!("/proc/{pid}/stat")).ok()?;
    Some(String::from_utf8_lossy(&raw).into_owned())
}

/// Field `n` of a /proc/PID/stat text, numbered as in proc(5) (3 is the
/// state, 4 the parent pid, 9 the flags, 22 the start time). The command
/// name (field 2) may hold anything, spaces and ')' included: fields are
/// counted after its last ')'.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(n.checked_sub(3)?)
}

/// Gone, or a zombie.
pub fn has_exited(pid: u32) -> bool {
    read_stat(pid).is_none_or(|stat| is_zombie(&stat))
}

/// State Z (exited, not yet reaped) or X (dead): no memory left to trace.
pub fn is_zombie(stat: &str) -> bool {
    stat_field(stat, 3).is_some_and(|state| state == "Z" || state == "X")
}

/// Where to open a path that process `pid` showed (in its maps or exe
/// link). In another mount namespace (a container) the path is the
/// process's own, under /proc/PID/root; in a chroot of this namespace the
/// kernel already shows it from our root, so it is used as it is when the
/// first does not exist. When neither is the file the process maps (it was
/// deleted or replaced on disk since, or its path is not UTF-8 and `path`
/// is its lossy form), the mapping itself, through /proc/PID/map_files.
pub fn host_path(pid: u32, path: &str) -> PathBuf {
    use std::os::unix::fs::MetadataExt as _;
    let under_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
    let by_path = if under_root.exists() || !std::path::Path::new(path).exists() {
        under_root
    } else {
        PathBuf::from(path)
    };
    let Some((inode, range)) = mapped_inode(pid, path) else {
        return by_path;
    };
    match fs::metadata(&by_path) {
        Ok(meta) if meta.ino() == inode => by_path,
        _ => PathBuf::from(format!("/proc/{pid}/map_files/{range}")),
    }
}

/// The inode and address range ("start-end") of a mapping of `path`
/// (as `Mapping::path` shows it) in `pid`.
fn mapped_inode(pid: u32, path: &str) -> Option<(u64, String)> {
    let maps = fs::read(format!("/proc/{pid}/maps")).ok()?;
    maps.split(|&b| b == b'\n').find_map(|line| {
        let (m, _) = parse_maps_line(line)?;
        if m.path != path {
            return None;
        }
        let text = std::str::from_utf8(line.get(..line.iter().position(|&b| b == b'/')?)?).ok()?;
        let inode = text.split_whitespace().nth(4)?.parse().ok()?;
        Some((inode, text.split_whitespace().next()?.to_string()))
    })
}

pub fn read_cmdline(pid: u32) -> String {
    read_cmdline_raw(pid).map_or_else(String::new, |raw| command_line(&raw))
}

/// A raw /proc/PID/cmdline as the report shows it: arguments joined by
/// spaces, ` [...]` when it was cut at `MAX_CMDLINE`.
pub fn command_line(raw: &[u8]) -> String {
    let mut command = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if raw.len() >= MAX_CMDLINE {
        command.push_str(" [...]");
    }
    command
}

/// The command line and the program (see `program_of`) of `pid`, from one
/// read of /proc/PID/cmdline: ("", None) when it is gone.
pub fn command_and_program(pid: u32) -> (String, Option<String>) {
    match read_cmdline_raw(pid) {
        Some(raw) => (command_line(&raw), program_in(pid, &raw)),
        None => (String::new(), None),
    }
}

/// Longest command line kept (bytes): a process controls its own, up to
/// several MiB, and the report keeps one per process.
pub const MAX_CMDLINE: usize = 4096;

/// /proc/PID/cmdline, its first `MAX_CMDLINE` bytes.
pub fn read_cmdline_raw(pid: u32) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let file = fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut raw = Vec::new();
    file.take(MAX_CMDLINE as u64).read_to_end(&mut raw).ok()?;
    Some(raw)
}

pub fn is_kernel_thread(stat: &str) -> bool {
    stat_field(stat, 9)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// argv[0] of a running process. A program that rewrote its argv into one
/// title (`redis-server *:6379`) gives the title's first word, unless the
/// whole names an existing file (a path with spaces).
pub fn program_of(pid: u32) -> Option<String> {
    program_in(pid, &read_cmdline_raw(pid)?)
}

/// `program_of`, from `pid`'s raw cmdline already read.
fn program_in(pid: u32, raw: &[u8]) -> Option<String> {
    let argv0 = raw.split(|&b| b == 0).next().filter(|a| !a.is_empty())?;
    let argv0 = String::from_utf8_lossy(argv0).into_owned();
    let file = match argv0.starts_with('/') {
        true => format!("/proc/{pid}/root{argv0}"),
        false => format!("/proc/{pid}/cwd/{argv0}"),
    };
    match argv0.split_whitespace().next() {
        Some(first) if first != argv0 && !Path::new(&file).is_file() => Some(first.to_string()),
        _ => Some(argv0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_whose_name_is_not_utf8_is_running() {
        use std::os::unix::ffi::OsStrExt as _;
        let dir = std::env::temp_dir().join(format!("memtrace-stat-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let bin = dir.join(std::ffi::OsStr::from_bytes(b"caf\xe9-\xff"));
        fs::copy("/bin/sleep", &bin).expect("copy sleep");
        let mut child = std::process::Command::new(&bin)
            .arg("5")
            .spawn()
            .expect("start sleep");
        let pid = child.id();
        // Until exec, the child has this test's name; then the odd one.
        let mut exec_done = false;
        for _ in 0..500 {
            exec_done = fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with(b"caf"));
            if exec_done {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (stat, exited) = (read_stat(pid), has_exited(pid));
        let _ = child.kill();
        let _ = child.wait();
        let _ = fs::remove_dir_all(&dir);
        assert!(exec_done, "the child did not exec");
        assert!(
            stat.as_deref().and_then(|s| stat_field(s, 22)).is_some(),
            "{stat:?}"
        );
        assert!(!exited);
    }

    #[test]
    fn a_huge_command_line_is_cut() {
        let huge = "x".repeat(100_000);
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 5", "name", &huge])
            .spawn()
            .expect("start sh");
        let pid = child.id();
        // Until exec, the child has this test's command line.
        let mut command = String::new();
        for _ in 0..500 {
            command = read_cmdline(pid);
            if command.starts_with("/bin/sh") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            command.starts_with("/bin/sh -c sleep 5 name xxx"),
            "{command:.80}"
        );
        assert!(
            command.ends_with("x [...]"),
            "{}",
            &command[command.len() - 20..]
        );
        assert!(command.len() <= MAX_CMDLINE + 6, "{} bytes", command.len());
    }

    #[test]
    fn zombie_state() {
        assert!(is_zombie("1234 (a) b) Z 1 1234"));
        assert!(!is_zombie("1234 (Z) S 1 1234"));
    }

    #[test]
    fn kernel_thread_flag() {
        let kthread = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0";
        let user = "1234 (my prog) (x) S 1 1234 1234 0 -1 4194560 100 0";
        assert!(is_kernel_thread(kthread));
        assert!(!is_kernel_thread(user));
    }
}
