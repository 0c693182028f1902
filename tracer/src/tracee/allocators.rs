//! Which objects of a process define allocator entry points, which of them
//! its calls reach, and what is hooked in each.
//!
//! The dynamic loader resolves a symbol to its first definition in load
//! order: the executable, then LD_PRELOAD objects, then the needed libraries
//! breadth first, then anything dlopen'ed. So the standard names (malloc,
//! free, ..., C++'s operator new and delete) are hooked in the first object
//! of that order that defines malloc and free, and only there: when an
//! executable or jemalloc defines malloc, glibc's malloc is not also counted
//! for the same calls. Allocator-specific names (jemalloc's mallocx family,
//! prefixed builds such as `_rjem_*` and `je_*`, tcmalloc's `tc_*`,
//! mimalloc's `mi_*`) do not collide with anything: they are hooked in every
//! object that defines them. Calls from one hooked function into another
//! (mimalloc's malloc into mi_malloc) count once: see `on_alloc_enter` in
//! tracer-ebpf.
//!
//! The names themselves are in `entry_points.rs`, the load order in
//! `search.rs`, what each file defines in `elf.rs`.

use std::{path::PathBuf, sync::Arc};

use super::{
    elf::{file_id, FileId, ObjectCache, ObjectInfo},
    entry_points::{AllocatorKind, EntryPoint, ENTRY_POINTS},
    search::{Candidate, Program},
};
use crate::error::TraceError;

/// `--allocator`: which object to hook instead of the detected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Auto,
    /// The object of that kind.
    Kind(AllocatorKind),
    /// This file (as the process sees it).
    Path(PathBuf),
}

impl Choice {
    pub fn parse(s: &str) -> Choice {
        match s {
            "auto" => Choice::Auto,
            name => match AllocatorKind::parse(name) {
                Some(kind) => Choice::Kind(kind),
                None => Choice::Path(PathBuf::from(name)),
            },
        }
    }
}

/// One object to hook for a process, and what in it.
#[derive(Clone, Debug)]
pub struct Hooked {
    /// Path as the process sees it.
    pub path: PathBuf,
    /// Path to open from the tracer (/proc/PID/map_files/... for a running
    /// process: the very file it maps, even when deleted or replaced since).
    pub host_path: PathBuf,
    pub id: FileId,
    pub kind: AllocatorKind,
    /// The object the standard names resolve to.
    pub resolves_malloc: bool,
    /// Whether it is the executable itself.
    pub is_executable: bool,
    /// Entry points to hook, in table order.
    pub entry_points: Vec<EntryPoint>,
    /// What the file defines (offsets, sizes, thunks), parsed once.
    pub info: Arc<ObjectInfo>,
}

impl Hooked {
    /// "jemalloc (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2)".
    pub fn describe(&self) -> String {
        let kind = match (self.kind, self.is_executable) {
            (AllocatorKind::Own, true) => "the executable's own allocator",
            (AllocatorKind::Own, false) => "a library's own allocator",
            (AllocatorKind::Interposer, _) => "malloc interposer",
            (k, _) => k.name(),
        };
        format!("{kind} ({})", self.path.display())
    }
}

impl Program {
    /// The objects to hook for this program.
    pub fn allocators(
        &self,
        cache: &mut ObjectCache,
        choice: &Choice,
    ) -> Result<Vec<Hooked>, TraceError> {
        let order = self.search_order(cache);
        let hooked = |c: &Candidate, resolves_malloc: bool| Hooked {
            path: c.path.clone(),
            host_path: c.host.clone(),
            id: c.id,
            kind: c.info.kind(&c.path),
            resolves_malloc,
            is_executable: c.path == self.exe,
            entry_points: ENTRY_POINTS
                .iter()
                .filter(|e| c.info.defined.contains_key(&e.name))
                .filter(|e| resolves_malloc || !e.standard)
                .cloned()
                .collect(),
            info: c.info.clone(),
        };
        let chosen = match choice {
            Choice::Auto => order.iter().find(|c| c.info.defines_malloc_and_free()),
            Choice::Kind(kind) => order.iter().find(|c| c.info.kind(&c.path) == *kind),
            Choice::Path(path) => {
                let id = file_id(&self.host(path));
                order.iter().find(|c| Some(c.id) == id || c.path == *path)
            }
        };
        let Some(chosen) = chosen else {
            return Err(self.not_found(choice, &order, cache));
        };
        let mut out = vec![hooked(chosen, true)];
        if *choice == Choice::Auto {
            for c in order.iter().filter(|c| c.id != chosen.id) {
                let h = hooked(c, false);
                if !h.entry_points.is_empty() {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    fn not_found(
        &self,
        choice: &Choice,
        order: &[Candidate],
        cache: &mut ObjectCache,
    ) -> TraceError {
        let objects: Vec<String> = order
            .iter()
            .filter(|c| !c.info.defined.is_empty())
            .map(|c| format!("{} ({})", c.path.display(), c.info.kind(&c.path).name()))
            .collect();
        let allocator = match choice {
            // Nothing to choose from: say why, as without --allocator.
            _ if objects.is_empty() => return self.no_allocator(cache),
            Choice::Auto => return self.no_allocator(cache),
            Choice::Kind(k) => k.name().to_string(),
            Choice::Path(p) => p.display().to_string(),
        };
        TraceError::AllocatorNotFound {
            allocator,
            choices: AllocatorKind::choices(),
            exe: self.exe.display().to_string(),
            objects: objects.join(", "),
        }
    }

    /// Why no object of this program defines malloc and free, as far as
    /// its executable tells.
    fn no_allocator(&self, cache: &mut ObjectCache) -> TraceError {
        let exe = self.exe.display().to_string();
        match cache.get(&self.exe_host) {
            Some((_, info)) if !info.native => TraceError::NotX86_64 {
                exe,
                machine: info.machine.clone(),
            },
            Some((_, info)) if !info.interp && info.symbols => TraceError::OwnAllocator { exe },
            _ => TraceError::NoAllocator { exe },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::ffi::OsStrExt as _, path::Path};

    use super::*;

    fn program(exe: &str) -> Program {
        Program::plain(exe)
    }

    #[test]
    fn finds_glibc_allocator_offsets() {
        let mut cache = ObjectCache::default();
        let me = Program::running(std::process::id()).expect("inspect self");
        let hooked = me.allocators(&mut cache, &Choice::Auto).expect("glibc");
        let libc = &hooked[0];
        assert_eq!(libc.kind, AllocatorKind::Glibc);
        let info = ObjectInfo::parse(&libc.host_path).expect("read libc");
        assert_ne!(info.defined["malloc"], info.defined["free"]);
        assert!(!info.defined.contains_key("mallocx"));
        assert!(info
            .needed
            .iter()
            .any(|n| n.as_bytes().starts_with(b"ld-linux")));
    }

    #[test]
    fn a_plain_program_resolves_malloc_to_glibc_and_hooks_nothing_else() {
        let mut cache = ObjectCache::default();
        let hooked = program("/bin/sh")
            .allocators(&mut cache, &Choice::Auto)
            .expect("sh uses glibc");
        assert_eq!(hooked.len(), 1, "{hooked:?}");
        assert_eq!(hooked[0].kind, AllocatorKind::Glibc);
        assert!(hooked[0].resolves_malloc);
        let names: Vec<&str> = hooked[0]
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert!(names.contains(&"malloc") && names.contains(&"free"));
    }

    #[test]
    fn preload_comes_before_needed_libraries() {
        let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
        if !Path::new(jemalloc).exists() {
            return; // cargo xtask setup installs it; the integration tests require it
        }
        let mut cache = ObjectCache::default();
        let mut p = program("/bin/sh");
        p.ld_preload = vec![jemalloc.into()];
        let hooked = p.allocators(&mut cache, &Choice::Auto).expect("resolve");
        assert_eq!(hooked[0].kind, AllocatorKind::Jemalloc);
        let names: Vec<&str> = hooked[0]
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        for n in [
            "malloc", "mallocx", "rallocx", "xallocx", "sdallocx", "_Znwm",
        ] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        // glibc defines no allocator-specific names: not hooked at all.
        assert_eq!(hooked.len(), 1, "{hooked:?}");
        // Overriding picks glibc instead.
        let forced = p
            .allocators(&mut cache, &Choice::Kind(AllocatorKind::Glibc))
            .expect("glibc is there");
        assert_eq!((forced.len(), forced[0].kind), (1, AllocatorKind::Glibc));
        let missing = p.allocators(&mut cache, &Choice::Kind(AllocatorKind::Mimalloc));
        assert!(missing.is_err());
    }

    /// heaptrack's preload library defines malloc, free and mi_malloc,
    /// wrappers that find the real ones with dlsym: it was taken for
    /// mimalloc.
    #[test]
    fn a_preloaded_malloc_wrapper_is_an_interposer_and_mimalloc_is_mimalloc() {
        let heaptrack = "/usr/lib/heaptrack/libheaptrack_preload.so";
        let mimalloc = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";
        if !Path::new(heaptrack).exists() || !Path::new(mimalloc).exists() {
            return; // cargo xtask setup installs them
        }
        let mut cache = ObjectCache::default();
        let mut p = program("/bin/sh");
        p.ld_preload = vec![heaptrack.into()];
        let hooked = p.allocators(&mut cache, &Choice::Auto).expect("resolve");
        assert_eq!(hooked[0].kind, AllocatorKind::Interposer);
        assert_eq!(
            hooked[0].describe(),
            format!("malloc interposer ({heaptrack})")
        );
        p.ld_preload = vec![mimalloc.into()];
        let hooked = p.allocators(&mut cache, &Choice::Auto).expect("resolve");
        assert_eq!(hooked[0].kind, AllocatorKind::Mimalloc);
    }
}
