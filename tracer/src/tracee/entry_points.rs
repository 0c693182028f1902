//! The allocators told apart and the entry points that can be hooked, by
//! name and role: the C, POSIX and C++ names that every allocator defines,
//! and one row per allocator with an API of its own (`FAMILIES`: jemalloc
//! with its prefixed builds, tcmalloc, mimalloc), which also says how an
//! object is known to be it. In which objects of a process each is hooked
//! is decided in `allocators.rs`.

use std::sync::LazyLock;

use tracer_common::Role;

/// The kinds of allocator objects told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllocatorKind {
    Glibc,
    Jemalloc,
    Tcmalloc,
    Mimalloc,
    /// A preload library wrapping the next malloc (heaptrack's).
    Interposer,
    /// An object defining malloc and free that is none of the above.
    Own,
}

impl AllocatorKind {
    /// Its name in reports and for `--allocator`.
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Glibc => "glibc",
            AllocatorKind::Jemalloc => "jemalloc",
            AllocatorKind::Tcmalloc => "tcmalloc",
            AllocatorKind::Mimalloc => "mimalloc",
            AllocatorKind::Interposer => "interposer",
            AllocatorKind::Own => "own",
        }
    }

    /// The kinds `--allocator` may name: glibc and each family.
    pub fn choosable() -> impl Iterator<Item = AllocatorKind> {
        std::iter::once(AllocatorKind::Glibc).chain(FAMILIES.iter().map(|f| f.kind))
    }

    /// What `--allocator` takes, in words: `auto, glibc, jemalloc, ...`.
    pub fn choices() -> String {
        let kinds: Vec<&str> = AllocatorKind::choosable()
            .map(AllocatorKind::name)
            .collect();
        format!("auto, {} or the path of a loaded object", kinds.join(", "))
    }

    /// The kind `--allocator NAME` names, if any.
    pub fn parse(name: &str) -> Option<AllocatorKind> {
        AllocatorKind::choosable().find(|k| k.name() == name)
    }
}

/// An allocator with an API of its own: what marks an object as it, and
/// the entry points it adds to the standard ones.
pub struct Family {
    pub kind: AllocatorKind,
    /// An object defining any of these functions is of this family...
    pub marks: &'static [&'static str],
    /// ...when it also defines one of these (none: no more is needed).
    pub confirms: &'static [&'static str],
    /// Its own entry points.
    pub api: &'static [(&'static str, Role)],
    /// Prefixes of builds configured with one: `api` and `prefixed_c` are
    /// also defined with each prefix.
    pub prefixes: &'static [&'static str],
    pub prefixed_c: &'static [(&'static str, Role)],
}

/// One row per allocator with an API of its own, in the order an object
/// is tested against them.
pub const FAMILIES: [Family; 3] = [
    Family {
        kind: AllocatorKind::Jemalloc,
        marks: &["mallocx", "_rjem_mallocx", "je_mallocx"],
        confirms: &[],
        api: JEMALLOC_API,
        prefixes: JEMALLOC_PREFIXES,
        prefixed_c: JEMALLOC_PREFIXED_C,
    },
    Family {
        kind: AllocatorKind::Tcmalloc,
        marks: &["tc_malloc"],
        confirms: &[],
        api: TCMALLOC_API,
        prefixes: &[],
        prefixed_c: &[],
    },
    // A library wrapping `mi_malloc` (heaptrack's) defines it too: mimalloc
    // itself also defines its API beyond the malloc family.
    Family {
        kind: AllocatorKind::Mimalloc,
        marks: &["mi_malloc"],
        confirms: &["mi_version", "mi_heap_new"],
        api: MIMALLOC_API,
        prefixes: &[],
        prefixed_c: &[],
    },
];

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
    for family in &FAMILIES {
        for &(n, r) in family.api {
            all.push(entry(n.to_string(), r, false));
        }
    }
    for family in &FAMILIES {
        for prefix in family.prefixes {
            for &(n, r) in family.prefixed_c.iter().chain(family.api) {
                all.push(entry(format!("{prefix}{n}"), r, false));
            }
        }
    }
    all
});

#[cfg(test)]
mod tests {
    use super::*;

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
    fn every_family_is_known_by_entry_points_and_chosen_by_its_name() {
        let names: Vec<&str> = ENTRY_POINTS.iter().map(|e| e.name.as_str()).collect();
        for family in &FAMILIES {
            assert!(
                family.marks.iter().all(|m| names.contains(m)),
                "{:?}: its marks are entry points (read from the object)",
                family.kind
            );
            assert_eq!(AllocatorKind::parse(family.kind.name()), Some(family.kind));
        }
        assert_eq!(AllocatorKind::parse("glibc"), Some(AllocatorKind::Glibc));
        assert_eq!(AllocatorKind::parse("own"), None);
        assert_eq!(AllocatorKind::parse("auto"), None);
        assert_eq!(
            AllocatorKind::choices(),
            "auto, glibc, jemalloc, tcmalloc, mimalloc or the path of a loaded object"
        );
    }
}
