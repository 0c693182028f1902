//! Allocators other than glibc's: the one the process's calls reach is
//! found and hooked, and only that one.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{
    harness::{compile_c, root_or_skip, Target},
    sites::{per_site_by, trace_sites_to_json, EXPECTED_PER_THREAD, O2_FLAGS},
};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";

/// Per-site sums keyed by the first `site_*` frame: with an interposed
/// allocator, glibc's reallocarray calls jemalloc's realloc, so the frame
/// nearest the allocator is glibc's, and the site is the one after it.
fn per_calling_site(report: &Value) -> BTreeMap<String, [u64; 4]> {
    per_site_by(report, |stack| {
        stack["frames"]
            .as_array()?
            .iter()
            .filter_map(|f| f["function"].as_str())
            .find(|f| f.starts_with("site_"))
            .map(str::to_string)
    })
}

/// Traces sites.c with `lib` preloaded: its functions are hooked (not
/// glibc's), the report names `kind`, and every site's numbers are exact.
fn assert_preloaded_allocator_exact(lib: &str, kind: &str, tag: &str) {
    assert!(
        std::path::Path::new(lib).exists(),
        "{lib} is missing: run `cargo xtask setup`"
    );
    let bin = compile_c("sites", tag, O2_FLAGS);
    let mut target = Target::start_with_env(&bin, &[], &[("LD_PRELOAD", lib)]);
    let report = trace_sites_to_json(&mut target, tag, true, libc::SIGINT);
    let hooks = report["hooks"].as_array().expect("hooks");
    let malloc = hooks
        .iter()
        .find(|h| h["function"] == "malloc")
        .expect("malloc hook");
    let module = malloc["module"].as_str().unwrap_or("");
    // The library as mapped: the soname link resolved to its file.
    let real = std::fs::canonicalize(lib).expect("library path");
    assert_eq!(std::path::Path::new(module), real, "{malloc}");
    assert!(
        report["notes"]
            .to_string()
            .contains(&format!("allocator hooked: {kind}")),
        "{}",
        report["notes"]
    );
    // Neither has reallocarray: skipped, not an error; glibc's reallocarray
    // then reaches the hooked realloc.
    let reallocarray = hooks
        .iter()
        .find(|h| h["function"] == "reallocarray")
        .expect("hook");
    assert_eq!(reallocarray["status"], "not defined in this object");
    let got = per_calling_site(&report);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * 2);
        assert_eq!(got.get(*site), Some(&want), "{site}: {got:#?}");
    }
}

#[test]
fn a_preloaded_jemalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    if !root_or_skip("a_preloaded_jemalloc_is_hooked_instead_of_glibc_with_exact_numbers") {
        return;
    }
    assert_preloaded_allocator_exact(JEMALLOC, "jemalloc", "jemalloc");
}

#[test]
fn a_preloaded_tcmalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    if !root_or_skip("a_preloaded_tcmalloc_is_hooked_instead_of_glibc_with_exact_numbers") {
        return;
    }
    assert_preloaded_allocator_exact(TCMALLOC, "tcmalloc", "tcmalloc");
}
