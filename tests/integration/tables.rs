//! `--unwind tables`: the kernel walks stacks from unwind tables, so stacks
//! are complete whatever their frame sizes and depth; code without unwind
//! information that keeps a frame pointer is crossed; exact mode loses
//! nothing with 32 threads allocating through deep frames. Targets are
//! built without frame pointers.

use serde_json::Value;

use crate::harness::{
    compile_c, compile_rust, function_names as names,
    http::{get, served_addr},
    sites::{assert_no_losses, assert_site_stacks_complete, assert_sites_exact, O2_FLAGS},
    JsonTracer, Target,
};

fn stacks(report: &Value) -> &[Value] {
    report["stacks"].as_array().expect("stacks array")
}

/// Every stack, for failure messages.
fn describe(report: &Value) -> String {
    let mut out = String::new();
    for s in stacks(report) {
        out.push_str(&format!(
            "inuse {} B / {} objs, alloc {} objs, truncated {}: {:?}\n",
            s["inuse_bytes"],
            s["inuse_objects"],
            s["alloc_objects"],
            s["truncated"],
            names(s)
        ));
    }
    out.push_str(&format!(
        "notes: {}\nlosses: {}\n",
        report["notes"], report["losses"]
    ));
    out
}

/// The stacks whose leaf frame is `leaf`.
fn with_leaf<'a>(report: &'a Value, leaf: &str) -> Vec<&'a Value> {
    stacks(report)
        .iter()
        .filter(|s| names(s).first() == Some(&leaf))
        .collect()
}

fn n(stack: &Value, key: &str) -> u64 {
    stack[key].as_u64().expect("a count")
}

/// Traces `bin` (ready/go/done protocol) by pid with `--unwind tables` and
/// `extra` arguments; returns the JSON report.
fn trace(bin: &std::path::Path, target_args: &[&str], tag: &str, extra: &[&str]) -> Value {
    let mut target = Target::start(bin, target_args);
    let pid = target.pid().to_string();
    let args = [&["--pid", pid.as_str(), "--unwind", "tables"], extra].concat();
    let tracer = JsonTracer::start(tag, &args);
    target.run_sites();
    let (report, _) = tracer.stop();
    assert_eq!(report["unwind"], "tables");
    report
}

/// A 64 KiB stack frame, assembly without CFI (frame-pointer step), and 32
/// threads making 2000 malloc/free pairs each through a 20 KiB frame 64
/// calls deep: exact numbers, complete stacks, no loss at the default
/// settings (the harness raises the ring buffer unless a test passes one:
/// 16 MiB is the tracer's default).
#[test]
fn tables_walk_big_frames_assembly_and_32_busy_threads_exactly() {
    let bin = compile_c("big_frames", "O2", O2_FLAGS);
    let report = trace(
        &bin,
        &["2000"],
        "tables-big-frames",
        &["--ringbuf-mb", "16"],
    );
    let all = describe(&report);
    assert_no_losses(&report);

    let big = with_leaf(&report, "site_big_frame");
    assert_eq!(big.len(), 1, "{all}");
    assert_eq!(names(big[0])[1..3], ["run_sites", "main"][..], "{all}");
    assert_eq!(names(big[0]).last(), Some(&"_start"), "{all}");
    assert_eq!(
        (n(big[0], "inuse_bytes"), n(big[0], "inuse_objects")),
        (1111, 1)
    );
    assert_eq!(big[0]["truncated"], false, "{all}");

    let asm = with_leaf(&report, "site_asm");
    assert_eq!(asm.len(), 1, "{all}");
    assert_eq!(
        names(asm[0])[1..4],
        ["asm_trampoline", "run_sites", "main"][..],
        "{all}"
    );
    assert_eq!(names(asm[0]).last(), Some(&"_start"), "{all}");
    assert_eq!(
        (n(asm[0], "inuse_bytes"), n(asm[0], "inuse_objects")),
        (2222, 1)
    );
    assert_eq!(asm[0]["truncated"], false, "{all}");

    // Each thread keeps its last 10 blocks of 100 + t bytes; 2000 made.
    let threads = with_leaf(&report, "site_thread_frame");
    let inuse: u64 = threads.iter().map(|s| n(s, "inuse_bytes")).sum();
    let objects: u64 = threads.iter().map(|s| n(s, "inuse_objects")).sum();
    let made: u64 = threads.iter().map(|s| n(s, "alloc_objects")).sum();
    let want: u64 = (0..32).map(|t| 10 * (100 + t)).sum();
    assert_eq!((inuse, objects, made), (want, 320, 32 * 2000), "{all}");
    for s in &threads {
        let names = names(s);
        assert_eq!(names.len(), 1 + 64 + 3, "{names:?}");
        assert!(names[1..65].iter().all(|f| *f == "descend"), "{names:?}");
        assert_eq!(
            names[65..],
            ["worker", "start_thread", "clone3"][..],
            "{all}"
        );
        assert_eq!(s["truncated"], false, "{all}");
    }
}

/// A malloc 300 calls deep (96-byte frames, 29 KiB of stack): every level,
/// then main, not truncated.
#[test]
fn tables_walk_a_300_deep_recursion_to_main() {
    let bin = compile_c("recurse", "O2-tables", O2_FLAGS);
    let report = trace(&bin, &["300"], "tables-recurse-300", &[]);
    let all = describe(&report);
    let mine = with_leaf(&report, "recurse");
    assert_eq!(mine.len(), 1, "{all}");
    let names = names(mine[0]);
    assert_eq!(mine[0]["truncated"], false, "{all}");
    assert!(names[..300].iter().all(|f| *f == "recurse"), "{names:?}");
    assert_eq!(names.get(300), Some(&"main"), "{names:?}");
    assert_eq!(
        (n(mine[0], "inuse_bytes"), n(mine[0], "inuse_objects")),
        (777, 1)
    );
}

/// The sites test (every allocator function, a worker thread, exact
/// numbers) in tables mode: the same numbers and complete stacks as DWARF.
#[test]
fn tables_sites_are_exact_and_complete() {
    let bin = compile_c("sites", "O2", O2_FLAGS);
    let report = trace(&bin, &[], "tables-sites", &[]);
    assert_sites_exact(&report);
    assert_site_stacks_complete(&report);
    assert_no_losses(&report);
}

/// A Rust release build (no frame pointers) through std to main.
#[test]
fn tables_walk_a_rust_release_build_to_main() {
    let bin = compile_rust("rust_allocs", &["-C", "opt-level=3"]);
    let report = trace(&bin, &[], "tables-rust", &[]);
    let all = describe(&report);
    for func in ["make_vec", "make_box", "make_string", "fill_map"] {
        let suffix = format!("::{func}");
        let mine: Vec<&Value> = stacks(&report)
            .iter()
            .filter(|s| names(s).iter().any(|n| n.ends_with(&suffix)))
            .collect();
        assert!(!mine.is_empty(), "no stack through *{suffix}:\n{all}");
        for s in mine {
            assert!(names(s).contains(&"main"), "{func}:\n{all}");
            assert_eq!(s["truncated"], false, "{func}:\n{all}");
        }
    }
}

/// `--binary`: the kernel reports every exec on the host, but only the
/// processes that run the binary get their maps read and unwind tables
/// built. Before, every program started during the trace had its tables
/// built on the event loop (seconds for a compiler's libraries) while the
/// binary's events, each carrying a stack copy until its maps were
/// described, filled the ring buffer: a fresh-clone CI run lost 1,490 of
/// site_churn's 40,000 allocations that way.
#[test]
fn binary_scope_builds_tables_only_for_the_binarys_own_files() {
    let bin = compile_c("sites", "binary-tables", O2_FLAGS);
    let tracer = JsonTracer::start(
        "binary-tables",
        &[
            std::ffi::OsStr::new("--binary"),
            bin.as_os_str(),
            std::ffi::OsStr::new("--verbose"),
        ],
    );
    // Programs that are not the binary, with files of their own (python3
    // maps its interpreter and extension libraries), started during the
    // trace.
    for _ in 0..3 {
        let status = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import json, ssl, sqlite3"])
            .status()
            .expect("run python3");
        assert!(status.success());
    }
    let mut target = Target::start(&bin, &[]);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", target.pid())).expect("maps");
    let files: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [_, perms, _, _, _, path, ..] if perms.contains('x') && path.starts_with('/') => {
                    Some(path)
                }
                _ => None,
            }
        })
        .collect();
    target.run_sites();
    let (report, out) = tracer.stop();
    assert_sites_exact(&report);
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("unwind tables: "))
        .unwrap_or_else(|| panic!("no tables line in --verbose output:\n{}", out.stderr));
    let built: usize = line
        .split("unwind tables: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no file count in {line}"));
    assert_eq!(
        built,
        files.len(),
        "tables in use should be the binary's own files {files:?}: {line}"
    );
}

/// A library dlopen'ed during the trace, allocating under a 64 KiB frame:
/// the first walk that meets it is finished from a stack copy (the kernel
/// has no table for it yet), which cannot reach past the big frame. The
/// stack keeps its leaf frames and is marked truncated, and the note says
/// why and what helps: before, it gave only "the walker stops at 512
/// frames", which was not the reason.
#[test]
fn a_walk_cut_at_a_library_dlopened_during_the_trace_is_explained() {
    let lib = compile_c(
        "dlopen_late",
        "lib",
        &[O2_FLAGS, &["-shared", "-fPIC", "-DAS_LIBRARY"]].concat(),
    );
    let bin = compile_c("dlopen_late", "O2", O2_FLAGS);
    let lib = lib.to_str().expect("a UTF-8 path");
    let report = trace(&bin, &[lib], "tables-dlopen-late", &[]);
    let all = describe(&report);
    let mine = with_leaf(&report, "lib_site");
    assert_eq!(mine.len(), 1, "{all}");
    assert_eq!(
        (n(mine[0], "inuse_bytes"), n(mine[0], "inuse_objects")),
        (3333, 1),
        "{all}"
    );
    assert_eq!(names(mine[0])[..2], ["lib_site", "lib_big_frame"], "{all}");
    // The tracer reads the process's maps at attach and again only when a
    // walk meets an address outside them: this first walk through the
    // library is finished from the 8192-byte copy, 64 KiB short.
    assert_eq!(mine[0]["truncated"], true, "{all}");
    let notes: Vec<&str> = report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let note = notes
        .iter()
        .find(|n| n.contains("marked [truncated]"))
        .unwrap_or_else(|| panic!("no note on the cut stack:\n{all}"));
    for words in [
        "1 walk at code mapped after the process's maps were read",
        "dlopen",
        "a copy of 8192 stack bytes",
        "raise --stack-bytes",
    ] {
        assert!(note.contains(words), "{words:?} not in {note:?}");
    }
    assert!(!note.contains("512 frames"), "{note:?}");
}

/// A process attached by --pid that runs code from anonymous executable
/// memory (a JIT's, keeping a frame pointer) from before the attach: the
/// kernel crosses it by its frame pointer from the first walk, and the
/// frame is named from the process's perf map, the name kept exact in
/// JSON. Before, --pid described only the process's files at attach, so
/// every walk through such code went back to user space with a stack copy
/// (all 100 here) until its maps happened to be read again.
#[test]
fn tables_cross_jit_code_of_a_process_attached_by_pid_from_the_first_walk() {
    let bin = compile_c("anon_code", "O2", O2_FLAGS);
    let mut target = Target::start(&bin, &["100"]);
    let pid = target.pid();
    let perf_map = format!("/tmp/perf-{pid}.map");
    let pid = pid.to_string();
    let tracer = JsonTracer::start(
        "tables-anon-code",
        &["--pid", pid.as_str(), "--unwind", "tables", "--verbose"],
    );
    target.run_sites();
    let (report, out) = tracer.stop();
    drop(target);
    let _ = std::fs::remove_file(&perf_map);
    let all = describe(&report);
    let mine = with_leaf(&report, "anon_site");
    assert_eq!(mine.len(), 1, "{all}");
    assert_eq!(
        (n(mine[0], "inuse_bytes"), n(mine[0], "inuse_objects")),
        (333_300, 100),
        "{all}"
    );
    assert_eq!(mine[0]["truncated"], false, "{all}");
    let names = names(mine[0]);
    assert_eq!(
        names[..3],
        ["anon_site", "JS:anon_trampoline \u{1b}[31mred", "main"],
        "{all}"
    );
    let walks = out
        .stderr
        .lines()
        .find(|l| l.contains("kernel walks: "))
        .unwrap_or_else(|| panic!("no kernel walks line:\n{}", out.stderr));
    assert!(
        walks.contains(" 0 finished from a stack copy")
            && walks.contains(": 100 frame-pointer steps"),
        "walks through the JIT code went back to user space: {walks}"
    );
}

/// A library unloaded and another loaded at its addresses (a plugin
/// reloaded) while traced by --pid. The kernel walks B's first stacks with
/// A's stale table and ends them early; the tracer then reads the maps
/// again at once, describes B to the kernel and no longer reuses what it
/// interned for those addresses: B's stacks are named from B. Before,
/// every stack through B was named from A (`a_site`) for the rest of the
/// trace. Each GET of the served profile handles every event queued
/// before it: it orders the phases. (Whether B's later stacks are
/// complete depends on when the tracer describes B: not asserted.)
#[test]
fn tables_follow_a_library_replaced_at_the_same_addresses() {
    let flags = [O2_FLAGS, &["-shared", "-fPIC"]].concat();
    let lib_a = compile_c("swap_libs", "lib-a", &[&flags[..], &["-DLIB_A"]].concat());
    let lib_b = compile_c("swap_libs", "lib-b", &[&flags[..], &["-DLIB_B"]].concat());
    let bin = compile_c("swap_libs", "O2", O2_FLAGS);
    let (a, b) = (
        lib_a.to_str().expect("utf-8"),
        lib_b.to_str().expect("utf-8"),
    );
    let mut target = Target::start(&bin, &[a, b]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(
        "tables-swap-libs",
        &["--pid", pid.as_str(), "--serve", "127.0.0.1:0"],
    );
    let addr = served_addr(&mut tracer);
    let mut phase = |cmd: &str| {
        target.send(cmd);
        let line = target.wait_for(&format!("did {cmd}"));
        assert_eq!(get(&addr, "/profile.json").0, 200);
        line.rsplit(' ').next().expect("an address").to_string()
    };
    let entry_a = phase("a");
    let entry_b = phase("b");
    phase("c");
    let (report, _) = tracer.stop();
    let all = describe(&report);
    // What this test is about: B where A was (the kernel reuses the hole).
    let base = |e: &str| u64::from_str_radix(e.trim_start_matches("0x"), 16).expect("hex") >> 12;
    assert_eq!(
        base(&entry_a),
        base(&entry_b),
        "B was not loaded at A's addresses"
    );
    let objects_under = |leaf: &str| -> u64 {
        with_leaf(&report, leaf)
            .iter()
            .map(|s| n(s, "alloc_objects"))
            .sum()
    };
    assert_eq!(objects_under("a_site"), 100, "{all}");
    assert_eq!(objects_under("b_site"), 200, "{all}");
    let a_stacks = with_leaf(&report, "a_site");
    assert_eq!(a_stacks.len(), 1, "{all}");
    assert_eq!(
        names(a_stacks[0])[..3],
        ["a_site", "a_mid", "main"],
        "{all}"
    );
    for s in with_leaf(&report, "b_site") {
        let names = names(s);
        assert!(!names.iter().any(|f| f.starts_with("a_")), "{all}");
        assert_eq!(names.get(1), Some(&"b_mid2"), "{all}");
    }
}
