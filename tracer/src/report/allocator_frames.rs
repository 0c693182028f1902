//! The frames of allocators and standard collections at the leaf of a
//! stack: a Rust `Vec::push` opens with about 16 inlined frames
//! (`alloc::raw_vec`, `RawVecInner::finish_grow`, `alloc::alloc`,
//! `__rust_alloc`, ...) before the caller's code. The text report and the
//! live page lead with the first frame outside them and count the rest, as
//! pprof and jeprof skip their allocator frames; collapsed, pprof, JSON and
//! speedscope keep every frame.
//!
//! What is folded is listed here and nowhere else.

use std::sync::Arc;

use super::Frame;

/// Names that start so: Rust's alloc crate and its re-exports in core and
/// std, std's collections (hashbrown behind `HashMap`), the global
/// allocator shims, allocator crates; C++'s allocators and `vector`
/// internals; the allocators' own internals. A trait method of one of
/// these types is named `<alloc::vec::Vec<T> as ...>::...`.
const PREFIXES: &[&str] = &[
    // Rust
    "alloc::",
    "<alloc::",
    "core::alloc::",
    "<core::alloc::",
    "std::alloc::",
    "<std::alloc::",
    "std::sys::alloc::",
    "std::sys::pal::unix::alloc::",
    "std::collections::",
    "<std::collections::",
    "hashbrown::",
    "<hashbrown::",
    "tikv_jemallocator::",
    "<tikv_jemallocator::",
    "jemallocator::",
    "<jemallocator::",
    "mimalloc::",
    "<mimalloc::",
    "__rust_",
    "__rdl_",
    "__rg_",
    // C++
    "operator new",
    "std::allocator<",
    "std::allocator_traits<",
    "std::__new_allocator<",
    "__gnu_cxx::new_allocator<",
    "__gnu_cxx::__new_allocator<",
    "std::_Vector_base<",
    // glibc malloc internals
    "__libc_",
    "__GI___libc_",
    "_int_",
    // jemalloc (prefixed or not), tcmalloc, mimalloc internals
    "je_",
    "_rjem_",
    "tcmalloc::",
    "_mi_",
];

/// Names folded as they are: the C allocator entry points (glibc,
/// jemalloc's unprefixed API, tcmalloc's, mimalloc's) and glibc's helpers.
const NAMES: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "reallocarray",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "_mid_memalign",
    "sysmalloc",
    "tcache_init",
    "malloc_hook_ini",
    "mallocx",
    "rallocx",
    "xallocx",
    "sdallocx",
    "nallocx",
    "tc_malloc",
    "tc_calloc",
    "tc_realloc",
    "tc_new",
    "tc_newarray",
    "tc_memalign",
    "tc_posix_memalign",
    "mi_malloc",
    "mi_calloc",
    "mi_realloc",
    "mi_zalloc",
    "mi_malloc_aligned",
    "mi_new",
    "mi_new_n",
    "mi_heap_malloc",
];

/// `std::vector<...>::` methods folded: its growth and its internals.
const VECTOR_METHODS: &[&str] = &["_M_", "push_back", "emplace_back", "reserve", "resize"];

/// True when `f` is a frame of an allocator or a standard collection.
pub fn is_allocator_frame(f: &Frame) -> bool {
    let name = f.function.as_str();
    if NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p)) {
        return true;
    }
    // `std::vector<T, std::allocator<T> >::_M_realloc_insert<...>(...)`:
    // the method follows the template arguments' last `>::`.
    let vector = name.strip_prefix("std::vector<").or_else(|| {
        name.strip_prefix("std::__cxx11::basic_string<")
            .filter(|rest| rest.contains(">::_M_"))
    });
    vector
        .and_then(|rest| rest.rsplit_once(">::"))
        .is_some_and(|(_, method)| VECTOR_METHODS.iter().any(|m| method.starts_with(m)))
}

/// How many of `frames` (leaf first) to fold: the allocator frames at the
/// leaf, unless every frame is one (a stack cut short inside the
/// allocator is shown whole).
pub fn leading_allocator_frames(frames: &[Arc<Frame>]) -> usize {
    // None: every frame is one.
    frames
        .iter()
        .position(|f| !is_allocator_frame(f))
        .unwrap_or(0)
}

/// `(+16 allocator frames)`, for the line of the first frame shown.
pub fn folded_note(folded: usize) -> String {
    match folded {
        1 => "(+1 allocator frame)".to_string(),
        n => format!("(+{n} allocator frames)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> Arc<Frame> {
        Arc::new(Frame {
            function: name.into(),
            ..Frame::default()
        })
    }

    #[test]
    fn allocator_and_collection_frames_are_told_from_the_callers() {
        let folded = [
            "alloc::raw_vec::RawVecInner<A>::finish_grow",
            "alloc::raw_vec::finish_grow<alloc::alloc::Global>",
            "<alloc::vec::Vec<T> as alloc::vec::spec_extend::SpecExtend<T,I>>::spec_extend",
            "alloc::alloc::exchange_malloc",
            "__rust_alloc",
            "__rdl_alloc",
            "<std::alloc::System as core::alloc::global::GlobalAlloc>::alloc",
            "std::collections::hash::map::HashMap<K,V,S>::insert",
            "hashbrown::raw::RawTable<T,A>::reserve_rehash",
            "<tikv_jemallocator::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
            "_rjem_malloc",
            "je_malloc_default",
            "operator new(unsigned long)",
            "operator new[](unsigned long)",
            "std::__new_allocator<int>::allocate(unsigned long, void const*)",
            "std::allocator_traits<std::allocator<int> >::allocate(std::allocator<int>&, unsigned long)",
            "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)",
            "std::vector<int, std::allocator<int> >::push_back(int const&)",
            "malloc",
            "__libc_malloc",
            "_int_malloc",
            "tcmalloc::allocate_full_malloc_oom",
            "mi_malloc",
            "_mi_malloc_generic",
        ];
        for name in folded {
            assert!(is_allocator_frame(&frame(name)), "{name}");
        }
        let kept = [
            "rust_allocs::make_vec",
            "<my_app::Cache as core::default::Default>::default",
            "main",
            "std::rt::lang_start_internal",
            "make_string",
            "mallocate_buffers",
            "std::vector<int, std::allocator<int> >::operator[](unsigned long)",
            "std::__cxx11::basic_string<char>::size() const",
            "[unknown]",
            "",
        ];
        for name in kept {
            assert!(!is_allocator_frame(&frame(name)), "{name}");
        }
    }

    #[test]
    fn only_the_run_at_the_leaf_is_folded_and_never_a_whole_stack() {
        let stack = |names: &[&str]| names.iter().map(|n| frame(n)).collect::<Vec<_>>();
        let s = stack(&[
            "__rust_alloc",
            "alloc::raw_vec::grow",
            "app::load",
            "malloc",
            "main",
        ]);
        assert_eq!(leading_allocator_frames(&s), 2);
        assert_eq!(leading_allocator_frames(&stack(&["app::load", "main"])), 0);
        assert_eq!(
            leading_allocator_frames(&stack(&["malloc", "_int_malloc"])),
            0
        );
        assert_eq!(leading_allocator_frames(&[]), 0);
        assert_eq!(folded_note(16), "(+16 allocator frames)");
        assert_eq!(folded_note(1), "(+1 allocator frame)");
    }
}
