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
//! The load order itself is `search.rs`; what each file defines, `elf.rs`.

use std::{
    path::PathBuf,
    sync::{Arc, LazyLock},
};

use tracer_common::Role;

use super::{
    elf::{file_id, FileId, ObjectCache, ObjectInfo},
    search::{Candidate, Program},
};
use crate::error::TraceError;

/// One entry point that can be hooked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    pub name: String,
    pub role: Role,
    /// A name that every allocator defines (C, POSIX, glibc, C++): hooked
    /// only where the dynamic loader resolves it.
    pub standard: bool,
}

/// The C and POSIX names, in the order the report lists them. The core
/// ones are listed for the chosen object even when it lacks them.
pub const CORE: &[(&str, Role)] = &[
    ("malloc", Role::Malloc),
    ("free", Role::Free),
    ("calloc", Role::Calloc),
    ("realloc", Role::Realloc),
    ("reallocarray", Role::ReallocArray),
    ("posix_memalign", Role::PosixMemalign),
    ("aligned_alloc", Role::AlignedAlloc),
    ("memalign", Role::Memalign),
    ("valloc", Role::Valloc),
    ("pvalloc", Role::Pvalloc),
];

/// C++ operators new and delete (Itanium mangling, 64-bit size_t). glibc's
/// libstdc++ implements them with malloc and free, which are hooked; an
/// allocator that defines them (jemalloc, tcmalloc, mimalloc) serves them
/// directly, so they are hooked in the object that also defines malloc.
const CXX: &[(&str, Role)] = &[
    ("_Znwm", Role::Malloc),
    ("_Znam", Role::Malloc),
    ("_ZnwmRKSt9nothrow_t", Role::Malloc),
    ("_ZnamRKSt9nothrow_t", Role::Malloc),
    ("_ZnwmSt11align_val_t", Role::Malloc),
    ("_ZnamSt11align_val_t", Role::Malloc),
    ("_ZnwmSt11align_val_tRKSt9nothrow_t", Role::Malloc),
    ("_ZnamSt11align_val_tRKSt9nothrow_t", Role::Malloc),
    ("_ZdlPv", Role::Free),
    ("_ZdaPv", Role::Free),
    ("_ZdlPvm", Role::Free),
    ("_ZdaPvm", Role::Free),
    ("_ZdlPvRKSt9nothrow_t", Role::Free),
    ("_ZdaPvRKSt9nothrow_t", Role::Free),
    ("_ZdlPvSt11align_val_t", Role::Free),
    ("_ZdaPvSt11align_val_t", Role::Free),
    ("_ZdlPvmSt11align_val_t", Role::Free),
    ("_ZdaPvmSt11align_val_t", Role::Free),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", Role::Free),
    ("_ZdaPvSt11align_val_tRKSt9nothrow_t", Role::Free),
];

/// jemalloc's non-standard API. Alignment and zeroing travel in `flags`
/// and do not change what is accounted: the requested size. xallocx
/// resizes in place and returns the resulting usable size.
const JEMALLOC_API: &[(&str, Role)] = &[
    ("mallocx", Role::Malloc),
    ("rallocx", Role::Realloc),
    ("xallocx", Role::Xallocx),
    ("dallocx", Role::Free),
    ("sdallocx", Role::Free),
];

/// Prefixes of jemalloc builds configured with --with-jemalloc-prefix:
/// `_rjem_` (Rust's tikv-jemalloc-sys) and `je_` (Redis's bundled copy).
const JEMALLOC_PREFIXES: &[&str] = &["_rjem_", "je_"];

/// The standard names a prefixed jemalloc also defines with its prefix.
const JEMALLOC_PREFIXED_C: &[(&str, Role)] = &[
    ("malloc", Role::Malloc),
    ("calloc", Role::Calloc),
    ("realloc", Role::Realloc),
    ("free", Role::Free),
    ("posix_memalign", Role::PosixMemalign),
    ("aligned_alloc", Role::AlignedAlloc),
    ("memalign", Role::Memalign),
    ("valloc", Role::Valloc),
];

/// gperftools' tcmalloc: `tc_*` (aliases of its malloc etc. where the
/// compiler allows, so counted once).
const TCMALLOC_API: &[(&str, Role)] = &[
    ("tc_malloc", Role::Malloc),
    ("tc_malloc_skip_new_handler", Role::Malloc),
    ("tc_calloc", Role::Calloc),
    ("tc_realloc", Role::Realloc),
    ("tc_free", Role::Free),
    ("tc_free_sized", Role::Free),
    ("tc_cfree", Role::Free),
    ("tc_memalign", Role::Memalign),
    ("tc_posix_memalign", Role::PosixMemalign),
    ("tc_valloc", Role::Valloc),
    ("tc_pvalloc", Role::Pvalloc),
    ("tc_new", Role::Malloc),
    ("tc_newarray", Role::Malloc),
    ("tc_new_nothrow", Role::Malloc),
    ("tc_newarray_nothrow", Role::Malloc),
    ("tc_new_aligned", Role::Malloc),
    ("tc_newarray_aligned", Role::Malloc),
    ("tc_new_aligned_nothrow", Role::Malloc),
    ("tc_newarray_aligned_nothrow", Role::Malloc),
    ("tc_delete", Role::Free),
    ("tc_deletearray", Role::Free),
    ("tc_delete_nothrow", Role::Free),
    ("tc_deletearray_nothrow", Role::Free),
    ("tc_delete_sized", Role::Free),
    ("tc_deletearray_sized", Role::Free),
    ("tc_delete_aligned", Role::Free),
    ("tc_deletearray_aligned", Role::Free),
    ("tc_delete_sized_aligned", Role::Free),
    ("tc_deletearray_sized_aligned", Role::Free),
    ("tc_delete_aligned_nothrow", Role::Free),
    ("tc_deletearray_aligned_nothrow", Role::Free),
];

/// mimalloc's public API (not the `mi_heap_*` functions, which take a heap
/// first). `mi_reallocf` also frees its argument when it fails; that
/// difference is not modelled.
const MIMALLOC_API: &[(&str, Role)] = &[
    ("mi_malloc", Role::Malloc),
    ("mi_zalloc", Role::Malloc),
    ("mi_malloc_aligned", Role::Malloc),
    ("mi_malloc_aligned_at", Role::Malloc),
    ("mi_zalloc_aligned", Role::Malloc),
    ("mi_zalloc_aligned_at", Role::Malloc),
    ("mi_new", Role::Malloc),
    ("mi_new_aligned", Role::Malloc),
    ("mi_new_nothrow", Role::Malloc),
    ("mi_new_aligned_nothrow", Role::Malloc),
    ("mi_calloc", Role::Calloc),
    ("mi_mallocn", Role::Calloc),
    ("mi_new_n", Role::Calloc),
    ("mi_calloc_aligned", Role::Calloc),
    ("mi_calloc_aligned_at", Role::Calloc),
    ("mi_realloc", Role::Realloc),
    ("mi_reallocf", Role::Realloc),
    ("mi_rezalloc", Role::Realloc),
    ("mi_realloc_aligned", Role::Realloc),
    ("mi_realloc_aligned_at", Role::Realloc),
    ("mi_rezalloc_aligned", Role::Realloc),
    ("mi_new_realloc", Role::Realloc),
    ("mi_reallocn", Role::ReallocArray),
    ("mi_recalloc", Role::ReallocArray),
    ("mi_reallocarray", Role::ReallocArray),
    ("mi_new_reallocn", Role::ReallocArray),
    ("mi_posix_memalign", Role::PosixMemalign),
    ("mi_aligned_alloc", Role::AlignedAlloc),
    ("mi_memalign", Role::Memalign),
    ("mi_valloc", Role::Valloc),
    ("mi_pvalloc", Role::Pvalloc),
    ("mi_free", Role::Free),
    ("mi_cfree", Role::Free),
    ("mi_free_size", Role::Free),
    ("mi_free_aligned", Role::Free),
    ("mi_free_size_aligned", Role::Free),
];

/// Every entry point, standard ones first.
pub static ENTRY_POINTS: LazyLock<Vec<EntryPoint>> = LazyLock::new(|| {
    let entry = |name: String, role, standard| EntryPoint {
        name,
        role,
        standard,
    };
    let mut all: Vec<EntryPoint> = CORE
        .iter()
        .chain(CXX)
        .chain(&[("cfree", Role::Free)])
        .map(|&(n, r)| entry(n.to_string(), r, true))
        .collect();
    for &(n, r) in JEMALLOC_API.iter().chain(TCMALLOC_API).chain(MIMALLOC_API) {
        all.push(entry(n.to_string(), r, false));
    }
    for prefix in JEMALLOC_PREFIXES {
        for &(n, r) in JEMALLOC_PREFIXED_C.iter().chain(JEMALLOC_API) {
            all.push(entry(format!("{prefix}{n}"), r, false));
        }
    }
    all
});
/// `--allocator`: which object to hook instead of the detected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Auto,
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc": the object of that kind.
    Kind(String),
    /// This file (as the process sees it).
    Path(PathBuf),
}

impl Choice {
    pub fn parse(s: &str) -> Choice {
        match s {
            "auto" => Choice::Auto,
            "glibc" | "jemalloc" | "tcmalloc" | "mimalloc" => Choice::Kind(s.to_string()),
            path => Choice::Path(PathBuf::from(path)),
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
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc" or "own".
    pub kind: &'static str,
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
            ("own", true) => "the executable's own allocator",
            ("own", false) => "a library's own allocator",
            (k, _) => k,
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
            Choice::Kind(kind) => order.iter().find(|c| c.info.kind(&c.path) == kind),
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
            .map(|c| format!("{} ({})", c.path.display(), c.info.kind(&c.path)))
            .collect();
        let allocator = match choice {
            // Nothing to choose from: say why, as without --allocator.
            _ if objects.is_empty() => return self.no_allocator(cache),
            Choice::Auto => return self.no_allocator(cache),
            Choice::Kind(k) => k.clone(),
            Choice::Path(p) => p.display().to_string(),
        };
        TraceError::AllocatorNotFound {
            allocator,
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
        assert_eq!(libc.kind, "glibc");
        let info = ObjectInfo::parse(&libc.host_path).expect("read libc");
        assert_ne!(info.defined["malloc"], info.defined["free"]);
        assert!(!info.defined.contains_key("mallocx"));
        assert!(info
            .needed
            .iter()
            .any(|n| n.as_bytes().starts_with(b"ld-linux")));
    }

    #[test]
    fn entry_point_names_are_unique() {
        let mut names: Vec<&str> = ENTRY_POINTS.iter().map(|e| e.name.as_str()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(names.contains(&"_rjem_sdallocx") && names.contains(&"je_mallocx"));
    }

    #[test]
    fn a_plain_program_resolves_malloc_to_glibc_and_hooks_nothing_else() {
        let mut cache = ObjectCache::default();
        let hooked = program("/bin/sh")
            .allocators(&mut cache, &Choice::Auto)
            .expect("sh uses glibc");
        assert_eq!(hooked.len(), 1, "{hooked:?}");
        assert_eq!(hooked[0].kind, "glibc");
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
        assert_eq!(hooked[0].kind, "jemalloc");
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
            .allocators(&mut cache, &Choice::Kind("glibc".into()))
            .expect("glibc is there");
        assert_eq!((forced.len(), forced[0].kind), (1, "glibc"));
        let missing = p.allocators(&mut cache, &Choice::Kind("mimalloc".into()));
        assert!(missing.is_err());
    }
}
