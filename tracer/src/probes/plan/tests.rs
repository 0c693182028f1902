//! `plan` on real objects of this machine (Debian's glibc and jemalloc).

use std::{path::Path, sync::Arc};

use super::*;
use crate::tracee::{
    elf::file_id,
    entry_points::{AllocatorKind, ENTRY_POINTS},
};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// `path` as `Program::allocators` would list it: the standard names only
/// where malloc resolves.
fn hooked(path: &str, kind: AllocatorKind, resolves_malloc: bool) -> Hooked {
    let info = Arc::new(ObjectInfo::parse(Path::new(path)).expect("parse object"));
    let entry_points = ENTRY_POINTS
        .iter()
        .filter(|e| info.defined.contains_key(&e.name))
        .filter(|e| resolves_malloc || !e.standard)
        .cloned()
        .collect();
    Hooked {
        path: path.into(),
        host_path: path.into(),
        id: file_id(Path::new(path)).expect("stat object"),
        kind,
        resolves_malloc,
        is_executable: false,
        entry_points,
        info,
    }
}

fn find<'a>(plan: &'a [PlannedProbe], function: &str) -> &'a PlannedProbe {
    plan.iter()
        .find(|p| p.function == function)
        .unwrap_or_else(|| panic!("{function} not planned: {plan:?}"))
}

fn skip(plan: &[PlannedProbe], function: &str) -> Option<Skip> {
    find(plan, function).action.clone().err()
}

#[test]
fn glibc_probes_malloc_and_free_and_counts_aliases_once() {
    let libc = hooked(LIBC, AllocatorKind::Glibc, true);
    let plan = plan(&libc, ProbePlacement::Emulated).expect("plan glibc");
    for f in ["malloc", "free", "calloc", "realloc", "aligned_alloc"] {
        let probe = find(&plan, f);
        let placed = probe.placed().unwrap_or_else(|| panic!("{f} probed"));
        assert_eq!(probe.offset, libc.info.defined[f]);
        // The probe sits at or after the symbol, within the function.
        assert!(placed.plain.0 >= probe.offset && placed.session.0 >= probe.offset);
        assert!(!placed.plain.1.is_empty());
        assert_eq!(placed.cookie & 0xff, probe.role as u64);
    }
    let alias = |of: &str| Some(Skip::Alias { of: of.into() });
    assert_eq!(skip(&plan, "memalign"), alias("aligned_alloc"));
    assert_eq!(skip(&plan, "cfree"), alias("free"));
    // Exactly one probe per address.
    let mut at: Vec<u64> = Vec::new();
    for p in plan.iter().filter(|p| p.placed().is_some()) {
        assert!(!at.contains(&p.offset), "{} probed twice", p.function);
        at.push(p.offset);
    }
}

#[test]
fn entry_placement_puts_probes_on_the_symbol() {
    let libc = hooked(LIBC, AllocatorKind::Glibc, true);
    let plan = plan(&libc, ProbePlacement::Entry).expect("plan glibc");
    let malloc = find(&plan, "malloc");
    let placed = malloc.placed().expect("malloc probed");
    assert_eq!(placed.plain.0, malloc.offset);
    assert_eq!(placed.session.0, malloc.offset);
    assert_eq!(placed.plain.1, "symbol (--probe-placement entry)");
}

#[test]
fn jemalloc_thunks_are_counted_where_they_jump() {
    if !Path::new(JEMALLOC).exists() {
        return; // cargo xtask setup installs it; the integration tests require it
    }
    let jemalloc = hooked(JEMALLOC, AllocatorKind::Jemalloc, true);
    let plan = plan(&jemalloc, ProbePlacement::Emulated).expect("plan jemalloc");
    for f in ["malloc", "free", "mallocx", "xallocx", "_Znwm"] {
        assert!(find(&plan, f).placed().is_some(), "{f} probed");
    }
    // Debian's build: operator new[] is `jmp operator new`, operator
    // delete[] is `jmp free@plt`.
    assert_eq!(
        skip(&plan, "_Znam"),
        Some(Skip::Thunk {
            to: "_Znwm".into(),
            plt: false
        })
    );
    assert_eq!(
        skip(&plan, "_ZdaPv"),
        Some(Skip::Thunk {
            to: "free".into(),
            plt: true
        })
    );
}

#[test]
fn a_plt_thunk_is_probed_where_malloc_does_not_resolve() {
    if !Path::new(JEMALLOC).exists() {
        return; // cargo xtask setup installs it; the integration tests require it
    }
    // free@plt then reaches another object's free, not hooked here: only
    // the allocator-specific names are listed, none skipped as a thunk
    // into the standard ones.
    let jemalloc = hooked(JEMALLOC, AllocatorKind::Jemalloc, false);
    let plan = plan(&jemalloc, ProbePlacement::Emulated).expect("plan jemalloc");
    assert!(plan
        .iter()
        .all(|p| p.function != "malloc" && p.function != "_ZdaPv"));
    assert!(!plan
        .iter()
        .any(|p| matches!(&p.action, Err(Skip::Thunk { plt: true, .. }))));
    assert!(find(&plan, "mallocx").placed().is_some());
}

#[test]
fn the_malloc_object_lists_the_c_functions_it_lacks() {
    let mut info = ObjectInfo::default();
    info.defined.insert("malloc".into(), 0x1000);
    info.defined.insert("free".into(), 0x2000);
    let mut object = hooked(LIBC, AllocatorKind::Own, true);
    object
        .entry_points
        .retain(|e| e.name == "malloc" || e.name == "free");
    object.info = Arc::new(info);
    let plan = plan(&object, ProbePlacement::Entry).expect("plan");
    let names: Vec<&str> = plan.iter().map(|p| p.function.as_str()).collect();
    assert_eq!(&names[..3], ["malloc", "free", "calloc"]);
    assert_eq!(skip(&plan, "pvalloc"), Some(Skip::NotDefined));
    assert_eq!(find(&plan, "pvalloc").offset, 0);
}

#[test]
fn the_malloc_object_must_define_malloc_and_free() {
    for (defined, missing) in [("malloc", "free"), ("free", "malloc")] {
        let mut info = ObjectInfo::default();
        info.defined.insert(defined.into(), 0x1000);
        let mut object = hooked(LIBC, AllocatorKind::Own, true);
        object.entry_points.retain(|e| e.name == defined);
        object.info = Arc::new(info);
        let err = plan(&object, ProbePlacement::Entry).expect_err("required missing");
        match err.downcast_ref::<TraceError>() {
            Some(TraceError::MissingRequired { symbol, .. }) => assert_eq!(*symbol, missing),
            other => panic!("{other:?}"),
        }
        // Elsewhere (malloc resolves to another object) nothing is required.
        object.resolves_malloc = false;
        assert!(plan(&object, ProbePlacement::Entry).is_ok());
    }
}

#[test]
fn statuses_read_as_the_report_has_always_written_them() {
    let cases = [
        (HookStatus::Attached { session: false }, "attached"),
        (
            HookStatus::Attached { session: true },
            "attached (uprobe session)",
        ),
        (
            HookStatus::Skipped(Skip::NotDefined),
            "not defined in this object",
        ),
        (
            HookStatus::Skipped(Skip::Alias { of: "free".into() }),
            "alias of free, counted there",
        ),
        (
            HookStatus::Skipped(Skip::Thunk {
                to: "free".into(),
                plt: true,
            }),
            "jumps to free through the PLT, counted there",
        ),
        (
            HookStatus::Skipped(Skip::Thunk {
                to: "_Znwm".into(),
                plt: false,
            }),
            "jumps to _Znwm, counted there",
        ),
    ];
    for (status, text) in cases {
        assert_eq!(status.to_string(), text);
        assert_eq!(status.is_attached(), text.starts_with("attached"));
    }
}

#[test]
fn facts_take_the_session_placement_except_for_free() {
    let libc = hooked(LIBC, AllocatorKind::Glibc, true);
    let plan = plan(&libc, ProbePlacement::Emulated).expect("plan glibc");
    let malloc = find(&plan, "malloc");
    let fact = malloc.fact(LIBC, true);
    let placed = malloc.placed().expect("malloc probed");
    assert_eq!(fact.status, HookStatus::Attached { session: true });
    assert_eq!(
        (fact.probe_offset, &fact.placement),
        (placed.session.0, &placed.session.1)
    );
    let free = find(&plan, "free").fact(LIBC, true);
    assert_eq!(free.status, HookStatus::Attached { session: false });
    let memalign = find(&plan, "memalign").fact(LIBC, false);
    assert_eq!(
        (memalign.probe_offset, memalign.placement.as_str()),
        (0, "")
    );
}
