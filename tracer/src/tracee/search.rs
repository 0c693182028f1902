//! An imitation of the dynamic loader (ld.so(8)): the objects a program
//! loads, in the order the loader searches them for a symbol, from its
//! executable, LD_PRELOAD, DT_NEEDED with DT_RPATH/DT_RUNPATH (`$ORIGIN`
//! expanded), LD_LIBRARY_PATH, ld.so.conf and the default directories, or
//! for a running process from what it maps.

use std::{
    collections::{HashSet, VecDeque},
    ffi::{OsStr, OsString},
    os::unix::ffi::{OsStrExt as _, OsStringExt as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{
    elf::{file_id, file_name, is_dynamic_loader, is_x86_64_elf, FileId, ObjectCache, ObjectInfo},
    ld_so_conf::ld_so_conf_dirs,
};
use crate::error::TraceError;

/// A program's objects in the dynamic loader's search order.
pub(super) struct Candidate {
    pub(super) path: PathBuf,
    pub(super) host: PathBuf,
    pub(super) id: FileId,
    pub(super) info: Arc<ObjectInfo>,
}

/// What decides a process's objects: its root directory, its executable,
/// and the loader's environment variables. Paths are bytes throughout.
pub struct Program {
    /// "/" or /proc/PID/root.
    pub root: PathBuf,
    /// Executable path inside `root`.
    pub exe: PathBuf,
    pub ld_preload: Vec<PathBuf>,
    pub ld_library_path: Vec<PathBuf>,
    /// Where to open the executable from.
    pub exe_host: PathBuf,
    /// The process's file-backed executable mappings, when it runs: the
    /// path it shows and where to open it (/proc/PID/map_files/..., right
    /// even in a chroot or another mount namespace, and for a file deleted
    /// or replaced on disk since it was mapped). dlopen'ed objects are
    /// only found here.
    pub mapped: Option<Vec<(PathBuf, PathBuf)>>,
    /// ld.so.conf's directories, read once.
    conf_dirs: std::cell::OnceCell<Vec<PathBuf>>,
}

/// An object a running process maps, parsed.
struct MappedObject {
    path: PathBuf,
    host: PathBuf,
    id: FileId,
    info: Arc<ObjectInfo>,
}

impl Program {
    /// A program about to be started by this tracer, with its environment.
    /// A script is its interpreter.
    pub fn to_start(exe: &Path) -> Program {
        let var = |k| std::env::var_os(k).unwrap_or_default();
        let exe = interpreter(exe).unwrap_or_else(|| exe.to_path_buf());
        Program {
            root: PathBuf::from("/"),
            exe_host: exe.clone(),
            exe,
            ld_preload: split_list(var("LD_PRELOAD").as_bytes(), b" :"),
            ld_library_path: split_list(var("LD_LIBRARY_PATH").as_bytes(), b":;"),
            mapped: None,
            conf_dirs: std::cell::OnceCell::new(),
        }
    }

    /// A running process (or one that just exec'ed: its libraries may not
    /// be mapped yet, and are then found by the loader's rules).
    pub fn running(pid: u32) -> Result<Program, TraceError> {
        let mut program = Program::just_executed(pid)?;
        let maps = std::fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mut mapped: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (m, file) in crate::tracee::process::parse_maps_files(&maps) {
            if m.executable && !mapped.iter().any(|(p, _)| *p == file) {
                let host =
                    PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
                mapped.push((file, host));
            }
        }
        program.mapped = Some(mapped);
        Ok(program)
    }

    /// A process that just exec'ed: its libraries may not be mapped yet,
    /// so they are found by the loader's rules alone (its maps are not
    /// read).
    pub fn just_executed(pid: u32) -> Result<Program, TraceError> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(|e| crate::tracee::process::unreadable(pid, "exe", &e))?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let mut preload: &[u8] = b"";
        let mut library_path: &[u8] = b"";
        for var in environ.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"LD_PRELOAD=") {
                preload = v;
            } else if let Some(v) = var.strip_prefix(b"LD_LIBRARY_PATH=") {
                library_path = v;
            }
        }
        Ok(Program {
            root: PathBuf::from(format!("/proc/{pid}/root")),
            exe_host: PathBuf::from(format!("/proc/{pid}/exe")),
            exe: crate::tracee::process::strip_deleted(exe.as_os_str().as_bytes()),
            ld_preload: split_list(preload, b" :"),
            ld_library_path: split_list(library_path, b":;"),
            mapped: None,
            conf_dirs: std::cell::OnceCell::new(),
        })
    }

    pub(super) fn host(&self, path: &Path) -> PathBuf {
        let mut p = self.root.clone().into_os_string();
        p.push(path.as_os_str());
        PathBuf::from(p)
    }

    /// The objects in the order the loader searches them for a symbol.
    /// For a running process these are the files it maps (opened through
    /// /proc/PID/map_files), each in its place in that order even when its
    /// path now names another file (a library upgraded on disk) or none.
    pub(super) fn search_order(&self, cache: &mut ObjectCache) -> Vec<Candidate> {
        let mapped: Option<Vec<MappedObject>> = self.mapped.as_ref().map(|m| {
            m.iter()
                .filter_map(|(path, host)| {
                    let (id, info) = cache.get(host)?;
                    Some(MappedObject {
                        path: path.clone(),
                        host: host.clone(),
                        id,
                        info,
                    })
                })
                .collect()
        });
        let mapped = mapped.as_deref().filter(|m| !m.is_empty());
        let mut out: Vec<Candidate> = Vec::new();
        let mut seen: HashSet<FileId> = HashSet::new();
        let mut add = |(path, host): (PathBuf, PathBuf), out: &mut Vec<Candidate>| {
            let (id, info) = cache.get(&host)?;
            if !info.native || !seen.insert(id) {
                return None;
            }
            out.push(Candidate {
                path,
                host,
                id,
                info: info.clone(),
            });
            Some(())
        };
        // The executable: /proc/PID/exe is the mapped file whatever
        // happened to its path.
        add((self.exe.clone(), self.exe_host.clone()), &mut out);
        let exe_dir = parent(&self.exe);
        for p in &self.ld_preload {
            if let Some(found) = self.locate(p.as_os_str(), &exe_dir, &[], &[], mapped) {
                add(found, &mut out);
            }
        }
        // Breadth first over DT_NEEDED, starting from the executable.
        let mut queue: VecDeque<usize> = (0..out.len().min(1)).collect();
        while let Some(i) = queue.pop_front() {
            let c = &out[i];
            let (needed, dir, info) = (c.info.needed.clone(), parent(&c.path), c.info.clone());
            for name in needed {
                let found = self.locate(&name, &dir, &info.runpath, &info.rpath, mapped);
                if let Some(found) = found {
                    if add(found, &mut out).is_some() {
                        queue.push_back(out.len() - 1);
                    }
                }
            }
        }
        let Some(mapped) = mapped else {
            return out;
        };
        // Keep what the process really maps; what it maps beyond that was
        // loaded later (dlopen) and comes last.
        out.retain(|c| mapped.iter().any(|m| m.id == c.id));
        for m in mapped {
            if !is_dynamic_loader(&m.path) {
                add((m.path.clone(), m.host.clone()), &mut out);
            }
        }
        out
    }

    /// Where the loader finds `name` (a DT_NEEDED or LD_PRELOAD entry):
    /// (path as the process sees it, path to open). In a running process,
    /// the object it maps for that name: the loader loads a soname once,
    /// and a file replaced or deleted on disk since is still the mapped
    /// one. Otherwise the loader's search on disk.
    fn locate(
        &self,
        name: &OsStr,
        origin: &Path,
        runpath: &[OsString],
        rpath: &[OsString],
        mapped: Option<&[MappedObject]>,
    ) -> Option<(PathBuf, PathBuf)> {
        let on_disk = self.find_library(name, origin, runpath, rpath);
        let Some(mapped) = mapped else {
            return on_disk.map(|p| {
                let host = self.host(&p);
                (p, host)
            });
        };
        let disk_id = on_disk.as_ref().and_then(|p| file_id(&self.host(p)));
        let found = mapped
            .iter()
            .find(|m| disk_id.is_some_and(|id| id == m.id))
            .or_else(|| {
                if name.as_bytes().contains(&b'/') {
                    let file = Path::new(name).file_name().map(OsStr::as_bytes);
                    mapped
                        .iter()
                        .find(|m| m.path.as_os_str() == name)
                        .or_else(|| mapped.iter().find(|m| Some(file_name(&m.path)) == file))
                } else {
                    mapped.iter().find(|m| {
                        m.info.soname.as_deref() == Some(name)
                            || file_name(&m.path) == name.as_bytes()
                    })
                }
            })?;
        Some((found.path.clone(), found.host.clone()))
    }

    /// The loader's search for a DT_NEEDED or LD_PRELOAD name (ld.so(8)):
    /// DT_RPATH when there is no DT_RUNPATH, LD_LIBRARY_PATH, DT_RUNPATH,
    /// the ld.so.conf directories, then the defaults.
    fn find_library(
        &self,
        name: &OsStr,
        origin: &Path,
        runpath: &[OsString],
        rpath: &[OsString],
    ) -> Option<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Some(PathBuf::from(name));
        }
        let expand = |d: &OsString| expand_origin(d.as_bytes(), origin.as_os_str().as_bytes());
        let mut dirs: Vec<PathBuf> = Vec::new();
        if runpath.is_empty() {
            dirs.extend(rpath.iter().map(expand));
        }
        dirs.extend(self.ld_library_path.iter().cloned());
        dirs.extend(runpath.iter().map(expand));
        dirs.extend(
            self.conf_dirs
                .get_or_init(|| ld_so_conf_dirs(&self.host(Path::new("/etc/ld.so.conf"))))
                .iter()
                .cloned(),
        );
        dirs.extend(
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib",
            ]
            .map(PathBuf::from),
        );
        dirs.into_iter()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| d.join(name))
            .find(|p| {
                let host = self.host(p);
                host.is_file() && is_x86_64_elf(&host)
            })
    }
}

/// The interpreter of a `#!` script (`#!/usr/bin/env NAME` looks NAME up
/// in PATH), or None for anything else.
fn interpreter(script: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = super::elf::open_regular(script)
        .ok()?
        .read(&mut head)
        .ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(OsStr::from_bytes);
    let first = PathBuf::from(words.next()?);
    if first.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.as_bytes().starts_with(b"-"))?;
        let paths = std::env::var_os("PATH")?;
        return std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file());
    }
    Some(first)
}

fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// `$ORIGIN` and `${ORIGIN}` in an rpath entry replaced by `origin`.
fn expand_origin(dir: &[u8], origin: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(dir.len());
    let mut rest = dir;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(b"${ORIGIN}") {
            out.extend_from_slice(origin);
            rest = r;
        } else if let Some(r) = rest.strip_prefix(b"$ORIGIN") {
            out.extend_from_slice(origin);
            rest = r;
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

fn split_list(s: &[u8], seps: &[u8]) -> Vec<PathBuf> {
    s.split(|b| seps.contains(b))
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(OsStr::from_bytes(p)))
        .collect()
}

#[cfg(test)]
impl Program {
    /// A program at `exe` in "/" with no loader variables.
    pub(super) fn plain(exe: &str) -> Program {
        Program {
            root: PathBuf::from("/"),
            exe: exe.into(),
            ld_preload: Vec::new(),
            ld_library_path: Vec::new(),
            exe_host: PathBuf::from(exe),
            mapped: None,
            conf_dirs: std::cell::OnceCell::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_expanded_in_bytes() {
        let dir = expand_origin(b"$ORIGIN/../lib:${ORIGIN}", b"/opt/\xff");
        assert_eq!(dir.as_os_str().as_bytes(), b"/opt/\xff/../lib:/opt/\xff");
    }
}
