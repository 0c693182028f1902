//! Allocators other than glibc's: the one the process's calls reach is
//! found and hooked, and only that one. Allocators and programs replaced
//! on disk while they run: replaced_on_disk.rs.

use serde_json::Value;

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStringExt as _,
    path::PathBuf,
};

use crate::harness::{
    compile_c, scratch,
    sites::{
        assert_no_losses, per_calling_site, trace_sites_to_json, trace_sites_with,
        EXPECTED_PER_THREAD, O2_FLAGS,
    },
    JsonTracer, Target,
};

pub(crate) const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
const TCMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4";
const MIMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2";

/// Traces sites.c with `lib` preloaded: its functions are hooked (not
/// glibc's), the report names `kind`, and every site's numbers are exact.
fn assert_preloaded_allocator_exact(lib: &str, kind: &str, tag: &str) {
    let bin = compile_c("sites", tag, O2_FLAGS);
    let mut target = Target::start_with_env(&bin, &[], &[("LD_PRELOAD", lib)]);
    let report = trace_sites_to_json(&mut target, tag, true, libc::SIGINT);
    assert_hooked_instead_of_glibc(&report, lib, kind);
    // Neither has reallocarray: skipped, not an error; glibc's reallocarray
    // then reaches the hooked realloc.
    let reallocarray = report["hooks"]
        .as_array()
        .expect("hooks")
        .iter()
        .find(|h| h["function"] == "reallocarray")
        .expect("hook");
    assert_eq!(reallocarray["status"], "not defined in this object");
    assert_sites_exact(&report);
}

/// sites.c linked against `lib` (a DT_NEEDED before libc, as `-lmimalloc`
/// gives): the loader resolves malloc there, so that is what is hooked.
/// `differs`: sites whose truth under this allocator is not glibc's.
fn assert_linked_allocator_exact(
    lib: &str,
    kind: &str,
    tag: &str,
    differs: &[(&str, [u64; 4])],
) -> Value {
    let mut flags = O2_FLAGS.to_vec();
    flags.extend(["-Wl,--no-as-needed", lib]);
    let bin = compile_c("sites", tag, &flags);
    let mut target = Target::start(&bin, &[]);
    let report = trace_sites_to_json(&mut target, tag, true, libc::SIGINT);
    assert_hooked_instead_of_glibc(&report, lib, kind);
    assert_sites_exact_but(&report, differs);
    report
}

pub(crate) fn assert_sites_exact(report: &Value) {
    assert_sites_exact_but(report, &[]);
}

fn assert_sites_exact_but(report: &Value, differs: &[(&str, [u64; 4])]) {
    let got = per_calling_site(report);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let per_thread = differs
            .iter()
            .find(|(s, _)| s == site)
            .map_or(per_thread, |(_, v)| v);
        let want = per_thread.map(|v| v * 2);
        assert_eq!(got.get(*site), Some(&want), "{site}: {got:#?}");
    }
    assert_no_losses(report);
}

/// malloc is hooked in `lib`, the report and the process entry name `kind`,
/// and glibc is not hooked at all.
pub(crate) fn assert_hooked_instead_of_glibc(report: &Value, lib: &str, kind: &str) {
    assert!(
        std::path::Path::new(lib).exists(),
        "{lib} is missing: run `cargo xtask setup`"
    );
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
    assert!(
        hooks
            .iter()
            .all(|h| !h["module"].as_str().unwrap_or("").contains("/libc.so")),
        "glibc must not be hooked as well: {hooks:#?}"
    );
    let process = &report["processes"][0];
    let allocators = process["allocators"].as_array().expect("allocators");
    assert_eq!(allocators.len(), 1, "{process}");
    assert_eq!(allocators[0]["kind"], kind, "{process}");
    assert_eq!(allocators[0]["resolves_malloc"], true, "{process}");
    assert!(
        allocators[0]["functions"].to_string().contains("\"free\""),
        "{process}"
    );
}

#[test]
fn a_preloaded_jemalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    assert_preloaded_allocator_exact(JEMALLOC, "jemalloc", "jemalloc");
}

#[test]
fn a_preloaded_tcmalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    assert_preloaded_allocator_exact(TCMALLOC, "tcmalloc", "tcmalloc");
}

#[test]
fn a_linked_mimalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    // mimalloc's realloc(p, 0) frees p but returns a new 0-byte block
    // (glibc's returns NULL): 3 live empty objects per thread.
    let realloc_zero = ("site_realloc_zero", [0, 3, 3 * 300, 6]);
    let report =
        assert_linked_allocator_exact(MIMALLOC, "mimalloc", "mimalloc-linked", &[realloc_zero]);
    // mimalloc's malloc, calloc and realloc move their arguments before
    // their first emulated instruction: the session probes sit there and
    // read the arguments where they went (the numbers above are exact).
    for f in ["malloc", "calloc", "realloc"] {
        let hook = report["hooks"]
            .as_array()
            .expect("hooks")
            .iter()
            .find(|h| h["function"] == f)
            .expect(f);
        let placement = hook["placement"].as_str().unwrap_or("");
        assert!(
            placement.contains("read from") && !placement.contains("single-stepped"),
            "{hook}"
        );
    }
}

#[test]
fn a_linked_tcmalloc_is_hooked_instead_of_glibc_with_exact_numbers() {
    assert_linked_allocator_exact(TCMALLOC, "tcmalloc", "tcmalloc-linked", &[]);
}

/// [in-use bytes, in-use objects, allocated bytes, allocated objects] per
/// function of tests/targets/jemalloc_api.c (see its comments).
const JEMALLOC_API_EXPECTED: &[(&str, [u64; 4])] = &[
    ("site_mallocx_aligned", [4 * 3000, 4, 4 * 3000, 4]),
    ("site_rallocx", [3 * 5000, 3, 3 * 5100, 6]),
    // In place: the block now holds min(usable 1024, 1010 + 10).
    ("site_xallocx_grow", [2 * 1020, 2, 2 * (1000 + 1020), 4]),
    // Could not grow: unchanged.
    ("site_xallocx_fail", [2 * 1000, 2, 2 * 1000, 2]),
    ("site_sized_free", [0, 0, 50 * 2000 + 30 * 700, 80]),
    ("site_operator_new", [5 * 48, 5, 10 * 48, 10]),
];

#[test]
fn jemallocs_own_api_and_operator_new_give_exact_numbers() {
    let bin = compile_c(
        "jemalloc_api",
        "linked",
        &["-O2", "-g", "-Wl,--no-as-needed", JEMALLOC],
    );
    for sessions in ["auto", "off"] {
        let mut target = Target::start(&bin, &[]);
        let tag = format!("jemalloc-api-{sessions}");
        let extra = ["--uprobe-sessions", sessions];
        let (report, _) = trace_sites_with(&mut target, &tag, true, libc::SIGINT, &extra);
        let hooks = report["hooks"].as_array().expect("hooks");
        for f in [
            "mallocx", "rallocx", "xallocx", "sdallocx", "dallocx", "_Znwm",
        ] {
            let hook = hooks.iter().find(|h| h["function"] == f).expect(f);
            assert!(
                hook["status"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("attached"),
                "{hook}"
            );
        }
        // operator delete is `jmp free@plt` in Debian's jemalloc: free's
        // probe counts it, and a second probe would see each block twice.
        let delete = hooks
            .iter()
            .find(|h| h["function"] == "_ZdlPv")
            .expect("_ZdlPv");
        assert_eq!(
            delete["status"], "jumps to free through the PLT, counted there",
            "{delete}"
        );
        assert_eq!(report["losses"]["unknown_frees"], 0, "{}", report["losses"]);
        let got = per_calling_site(&report);
        for (site, want) in JEMALLOC_API_EXPECTED {
            assert_eq!(got.get(*site), Some(want), "{sessions}: {site}: {got:#?}");
        }
        assert_no_losses(&report);
    }
}

/// A static executable is its own allocator: glibc's malloc linked into it
/// is hooked there, from its symbol table.
#[test]
fn a_static_executable_with_symbols_is_traced_exactly() {
    let bin = compile_c("sites", "static", &["-O1", "-g", "-static"]);
    let mut target = Target::start(&bin, &[]);
    let report = trace_sites_to_json(&mut target, "sites-static", true, libc::SIGINT);
    let process = &report["processes"][0];
    assert_eq!(process["allocators"][0]["kind"], "glibc", "{process}");
    let module = report["hooks"][0]["module"].as_str().unwrap_or("");
    assert_eq!(
        std::path::Path::new(module),
        std::fs::canonicalize(&bin).expect("path"),
        "{}",
        report["hooks"]
    );
    assert_sites_exact(&report);
}

/// `--allocator` overrides detection: with jemalloc preloaded, `glibc`
/// hooks libc (which then sees only the calls that still reach it), and
/// jemalloc's path hooks jemalloc, with exact numbers.
#[test]
fn the_allocator_flag_overrides_detection() {
    let bin = compile_c("sites", "override", O2_FLAGS);
    for (choice, kind) in [("glibc", "glibc"), (JEMALLOC, "jemalloc")] {
        let mut target = Target::start_with_env(&bin, &[], &[("LD_PRELOAD", JEMALLOC)]);
        let tag = format!("override-{kind}");
        let extra = ["--allocator", choice];
        let (report, _) = trace_sites_with(&mut target, &tag, true, libc::SIGINT, &extra);
        let allocators = report["processes"][0]["allocators"]
            .as_array()
            .expect("allocators");
        assert_eq!(allocators.len(), 1, "{allocators:?}");
        assert_eq!(allocators[0]["kind"], kind, "{allocators:?}");
        if kind == "jemalloc" {
            assert_sites_exact(&report);
        } else {
            // jemalloc has no reallocarray: sites.c's reallocarray calls
            // reach glibc's, the one hooked function they still call.
            let got = per_calling_site(&report);
            let want = EXPECTED_PER_THREAD
                .iter()
                .find(|(site, _)| *site == "site_reallocarray")
                .map(|(_, v)| v.map(|v| v * 2));
            assert_eq!(got.len(), 1, "{got:#?}");
            assert_eq!(got.get("site_reallocarray").copied(), want, "{got:#?}");
        }
    }
}

/// `--binary` at paths that are not UTF-8, or hold spaces and a newline:
/// the program is found, hooked and traced like any other.
#[test]
fn binary_paths_that_are_not_utf8_are_traced_exactly() {
    let built = compile_c("sites", "odd-path", O2_FLAGS);
    let names: [&[u8]; 2] = [b"caf\xe9-\xff/prog\xfe", b"with space\nand newline/my prog"];
    for (i, name) in names.iter().enumerate() {
        let mut path = scratch(&format!("odd-path-{i}"))
            .into_os_string()
            .into_vec();
        path.push(b'/');
        path.extend_from_slice(name);
        let bin = PathBuf::from(OsString::from_vec(path));
        let _ = std::fs::remove_dir_all(bin.parent().expect("dir"));
        std::fs::create_dir_all(bin.parent().expect("dir")).expect("mkdir");
        std::fs::copy(&built, &bin).expect("copy target");
        let tracer = JsonTracer::start(
            &format!("odd-path-{i}"),
            &[OsStr::new("--binary"), bin.as_os_str()],
        );
        let mut target = Target::start(&bin, &[]);
        target.run_sites();
        let (report, _) = tracer.stop();
        assert_eq!(
            report["processes"][0]["pid"],
            target.pid(),
            "{}",
            report["processes"]
        );
        // Leaf frames named (the sites' numbers); whole stacks are not
        // checked: under --binary the first samples may come before the
        // process's libraries are in the maps the tracer read at its exec.
        crate::harness::sites::assert_sites_exact(&report);
    }
}

/// [in-use bytes, in-use objects, allocated bytes, allocated objects] per
/// function of tests/targets/new_array.c.
const NEW_ARRAY_EXPECTED: &[(&str, [u64; 4])] = &[
    ("site_new_array", [20_000, 20, 20_000, 20]),
    ("site_new_array_deleted", [0, 0, 300_000, 1000]),
    ("site_new_array_nothrow", [1000, 5, 1000, 5]),
    ("site_new_object", [6 * 48, 6, 10 * 48, 10]),
];

/// jemalloc's operator new[] is `jmp operator new`: it is not probed
/// itself (operator new's probe counts the call), so no return probe
/// fires without its entry, and every call counts once.
#[test]
fn jemallocs_operator_new_array_counts_once_without_returns_without_entry() {
    let bin = compile_c(
        "new_array",
        "jemalloc",
        &["-O2", "-g", "-Wl,--no-as-needed", JEMALLOC],
    );
    for sessions in ["auto", "off"] {
        let (report, _) = JsonTracer::spawn(
            &format!("new-array-{sessions}"),
            &[
                "--uprobe-sessions",
                sessions,
                "--",
                bin.to_str().expect("utf-8 path"),
            ],
        )
        .finish();
        let hooks = report["hooks"].as_array().expect("hooks");
        for (thunk, target) in [
            ("_Znam", "_Znwm"),
            ("_ZnamRKSt9nothrow_t", "_ZnwmRKSt9nothrow_t"),
        ] {
            let hook = hooks.iter().find(|h| h["function"] == thunk).expect(thunk);
            assert_eq!(
                hook["status"],
                format!("jumps to {target}, counted there"),
                "{hook}"
            );
        }
        let losses = &report["losses"];
        assert_eq!(losses["return_without_entry"], 0, "{sessions}: {losses}");
        assert_eq!(losses["unknown_frees"], 0, "{sessions}: {losses}");
        assert_no_losses(&report);
        let got = per_calling_site(&report);
        for (site, want) in NEW_ARRAY_EXPECTED {
            assert_eq!(got.get(*site), Some(want), "{sessions}: {site}: {got:#?}");
        }
    }
}
