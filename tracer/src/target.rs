//! The process being traced: validation, its memory map, and where its
//! allocator lives. Paths are resolved through /proc/PID/root so that
//! processes in other mount namespaces (containers) work.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::Context as _;
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use crate::error::TraceError;

/// PF_KTHREAD in include/linux/sched.h: the task is a kernel thread.
const PF_KTHREAD: u64 = 0x0020_0000;

/// One line of /proc/PID/maps that is backed by a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub executable: bool,
    /// Path as the process sees it.
    pub path: String,
}

/// Parses /proc/PID/maps text, keeping file-backed mappings only.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let _dev = fields.next()?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let path = fields.next()?.trim_start();
    if inode == 0 || !path.starts_with('/') {
        return None; // anonymous, [heap], [stack], [vdso]...
    }
    let (start, end) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        path: path.trim_end_matches(" (deleted)").to_string(),
    })
}

/// A process we are about to trace.
#[derive(Debug)]
pub struct Process {
    pub pid: u32,
    /// Command line, arguments joined with spaces.
    pub command: String,
    pub exe: String,
    pub mappings: Vec<Mapping>,
}

impl Process {
    /// Checks that `pid` is a live user process and reads its maps.
    pub fn inspect(pid: u32) -> Result<Process, TraceError> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let stat = fs::read_to_string(proc_dir.join("stat"))
            .map_err(|_| TraceError::NoSuchProcess(pid))?;
        if is_kernel_thread(&stat) {
            return Err(TraceError::KernelThread(pid));
        }
        let maps = fs::read_to_string(proc_dir.join("maps"))
            .map_err(|_| TraceError::NoSuchProcess(pid))?;
        let exe = fs::read_link(proc_dir.join("exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        Ok(Process {
            pid,
            command: read_cmdline(pid),
            exe,
            mappings: parse_maps(&maps),
        })
    }

    /// The glibc this process maps, as the path the process sees.
    pub fn libc_path(&self) -> Result<String, TraceError> {
        self.mappings
            .iter()
            .map(|m| m.path.as_str())
            .find(|p| is_libc(p))
            .map(str::to_string)
            .ok_or_else(|| TraceError::NoLibc {
                pid: self.pid,
                exe: self.exe.clone(),
            })
    }
}

/// The object whose allocator a process's calls reach, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocator {
    /// Path as the process sees it.
    pub path: String,
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc", or "the executable's own".
    pub kind: String,
}

impl Process {
    /// Which mapped object's malloc and free the process's calls reach.
    /// Symbol lookup goes through the executable, then preloaded and needed
    /// libraries, then libc; so an executable that defines malloc wins,
    /// then another library that defines both (jemalloc, tcmalloc,
    /// mimalloc, preloaded or linked), then glibc. Only that one is hooked,
    /// so nothing is counted twice.
    pub fn allocator(&self) -> Result<Allocator, TraceError> {
        let libc = self.libc_path()?;
        let mut objects: Vec<&str> = Vec::new();
        for m in self.mappings.iter().filter(|m| m.executable) {
            if !objects.contains(&m.path.as_str()) {
                objects.push(&m.path);
            }
        }
        // The executable first; ld.so and libc are not candidates here.
        objects.sort_by_key(|p| *p != self.exe);
        let chosen = objects
            .into_iter()
            .filter(|p| *p != libc && !is_dynamic_loader(p))
            .find(|p| defines_malloc_and_free(&host_path(self.pid, p)));
        Ok(match chosen {
            Some(path) => Allocator {
                kind: allocator_kind(path, &self.exe),
                path: path.to_string(),
            },
            None => Allocator {
                path: libc,
                kind: "glibc".into(),
            },
        })
    }
}

fn is_dynamic_loader(path: &str) -> bool {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("ld-linux") || n.starts_with("ld-"))
}

fn defines_malloc_and_free(path: &Path) -> bool {
    function_offsets(path, &["malloc", "free"]).is_ok_and(|found| found.len() == 2)
}

fn allocator_kind(path: &str, exe: &str) -> String {
    if path == exe {
        return "the executable's own".into();
    }
    let name = Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path);
    ["jemalloc", "tcmalloc", "mimalloc"]
        .into_iter()
        .find(|k| name.contains(k))
        .unwrap_or("a library's own")
        .to_string()
}

pub fn host_path(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

pub fn read_cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

fn is_kernel_thread(stat: &str) -> bool {
    // Fields after the parenthesised comm: state ppid pgrp session tty_nr
    // tpgid flags ... (proc(5)); comm itself may contain spaces and ')'.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(6))
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_KTHREAD != 0)
}

fn is_libc(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    name.starts_with("libc.so") || (name.starts_with("libc-") && name.ends_with(".so"))
}

/// File offsets of the named functions defined in an ELF file, from the
/// dynamic and the static symbol table. Uprobes are placed by file offset.
pub fn function_offsets(path: &Path, names: &[&str]) -> anyhow::Result<HashMap<String, u64>> {
    let data = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", path.display()))?;
    let mut found = HashMap::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if !names.contains(&name) || found.contains_key(name) {
            continue;
        }
        if let Some(offset) = vaddr_to_file_offset(&file, sym.address()) {
            found.insert(name.to_string(), offset);
        }
    }
    Ok(found)
}

fn vaddr_to_file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|seg| {
        let (file_start, file_size) = seg.file_range();
        let rel = vaddr.checked_sub(seg.address())?;
        (rel < file_size).then_some(file_start + rel)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 1234 /usr/bin/target
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 1234 /usr/bin/target
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0 [heap]
7f1e2a028000-7f1e2a1bd000 r-xp 00028000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2a400000-7f1e2a401000 r-xp 00000000 fe:01 999 /tmp/gone lib.so (deleted)
7ffd1c7e0000-7ffd1c7e2000 r-xp 00000000 00:00 0 [vdso]
";

    #[test]
    fn parses_file_backed_mappings_only() {
        let maps = parse_maps(MAPS);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[1],
            Mapping {
                start: 0x55d0_c8a0_1000,
                end: 0x55d0_c8a0_2000,
                offset: 0x1000,
                executable: true,
                path: "/usr/bin/target".into()
            }
        );
        assert!(!maps[0].executable);
        assert_eq!(maps[3].path, "/tmp/gone lib.so");
    }

    #[test]
    fn recognises_libc_names() {
        assert!(is_libc("/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(is_libc("/lib/libc-2.31.so"));
        assert!(!is_libc("/usr/lib/libcrypto.so.3"));
        assert!(!is_libc("/usr/lib/libc_malloc_debug.so.0"));
    }

    #[test]
    fn kernel_thread_flag() {
        let kthread = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0";
        let user = "1234 (my prog) (x) S 1 1234 1234 0 -1 4194560 100 0";
        assert!(is_kernel_thread(kthread));
        assert!(!is_kernel_thread(user));
    }

    #[test]
    fn finds_glibc_allocator_offsets() {
        let me = Process::inspect(std::process::id()).expect("inspect self");
        let libc = me.libc_path().expect("test binary maps libc");
        let offsets = function_offsets(
            &host_path(me.pid, &libc),
            &["malloc", "free", "no_such_function"],
        )
        .expect("read libc");
        assert!(offsets.contains_key("malloc") && offsets.contains_key("free"));
        assert!(!offsets.contains_key("no_such_function"));
        assert_ne!(offsets["malloc"], offsets["free"]);
    }
}
