//! A Rust program whose `#[global_allocator]` is tikv-jemallocator
//! (tests/targets/rjem): jemalloc linked statically into the executable
//! under prefixed names (`_rjem_malloc`, ...), called by no shared library.
//! The tracer hooks those functions in the executable itself and gives
//! exact per-function numbers.

use std::{collections::BTreeSet, path::Path};

use crate::harness::{
    rjem::{rjem_binary, EXPECTED_PER_THREAD},
    sites::{assert_counters_zero, per_calling_site, trace_sites_to_json, LOSSES},
    Target,
};

/// The main thread and one worker run every function.
const THREADS: u64 = 2;

/// Every jemalloc entry point tikv-jemallocator's GlobalAlloc calls (and
/// the program reaches); `_rjem_free` is never called (dealloc is sdallocx).
const ENTRY_POINTS: &[&str] = &[
    "_rjem_malloc",
    "_rjem_calloc",
    "_rjem_realloc",
    "_rjem_mallocx",
    "_rjem_rallocx",
    "_rjem_sdallocx",
];

#[test]
fn a_static_tikv_jemallocator_is_hooked_in_the_executable_with_exact_numbers() {
    let bin = rjem_binary();
    let mut target = Target::start(bin, &[]);
    let report = trace_sites_to_json(&mut target, "rjem", true, libc::SIGINT);

    let exe = std::fs::canonicalize(bin).expect("rjem binary path");
    let hooks = report["hooks"].as_array().expect("hooks");
    for name in ENTRY_POINTS {
        let hook = hooks
            .iter()
            .find(|h| {
                h["function"] == *name && Path::new(h["module"].as_str().unwrap_or("")) == exe
            })
            .unwrap_or_else(|| panic!("no hook of {name} in {}: {hooks:#?}", exe.display()));
        assert!(
            hook["status"]
                .as_str()
                .is_some_and(|s| s.starts_with("attached")),
            "{hook}"
        );
    }

    let got = per_calling_site(&report);
    for (function, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS);
        assert_eq!(
            got.get(*function),
            Some(&want),
            "{function}: [inuse bytes, inuse objects, alloc bytes, alloc objects] differ; all: {got:#?}"
        );
    }
    let names: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = EXPECTED_PER_THREAD.iter().map(|(f, _)| *f).collect();
    assert_eq!(names, expected, "functions seen: {got:#?}");

    assert_counters_zero(&report, LOSSES);
}
