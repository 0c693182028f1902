//! JIT frames named from the JIT's perf map: node `--perf-basic-prof`
//! running a leaky script (tests/targets/leaky.js), traced by pid while it
//! holds its buffers. The stack crosses V8's JIT frames (frame-pointer
//! steps) and reaches `_start`: node's `main` tail-calls `node::Start`, so
//! `main` is no frame of its own. And a C program running code from an
//! anonymous page (tests/targets/anon_code.c) whose perf map is a symbolic
//! link: refused, and the report says so.

use serde_json::Value;

use crate::harness::{compile_c, sites::O2_FLAGS, target_source, JsonTracer, Target};

/// (function, module) of each frame of a stack, leaf first.
fn names(stack: &Value) -> Vec<(String, String)> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| {
            (
                f["function"].as_str().unwrap_or("").to_string(),
                f["module"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn node_perf_map_names_the_js_function_and_the_stack_is_complete() {
    let script = target_source("leaky.js");
    let script = script.to_str().expect("utf-8 path");
    let mut node = Target::start(
        std::path::Path::new("node"),
        &[
            "--perf-basic-prof",
            // Each interpreted function runs in its own copy of the
            // interpreter's entry, named in the map; no optimizing tier, so
            // little code is compiled (and mapped) after the warm-up.
            "--interpreted-frames-native-stack",
            "--no-opt",
            "--no-sparkplug",
            "--no-maglev",
            script,
        ],
    );
    let pid = node.pid().to_string();
    let tracer = JsonTracer::start("jit-names-node", &["--pid", pid.as_str()]);
    node.run_sites();
    let (report, _) = tracer.stop();
    let stacks = report["stacks"].as_array().expect("stacks");
    let leaky: Vec<(&Value, Vec<(String, String)>)> = stacks
        .iter()
        .map(|s| (s, names(s)))
        .filter(|(_, n)| n.iter().any(|(f, _)| f.contains("leakyFunctionName")))
        // The buffers' backing stores (the function also runs V8's
        // compilers, which allocate, and a BackingStore object per buffer).
        .filter(|(_, n)| {
            n.first()
                .is_some_and(|(f, _)| f.contains("AllocateUninitialized"))
        })
        .collect();
    let all: String = stacks
        .iter()
        .filter(|s| s["alloc_bytes"].as_u64() >= Some(65536))
        .map(|s| format!("{} {:?}\n", s["truncated"], names(s)))
        .collect();
    assert!(
        !leaky.is_empty(),
        "no buffer's stack names the JS function:\n{all}"
    );
    // 2000 buffers of 64-88 KiB, all held, every one under the named function.
    let objects: u64 = leaky
        .iter()
        .filter_map(|(s, _)| s["inuse_objects"].as_u64())
        .sum();
    let bytes: u64 = leaky
        .iter()
        .filter_map(|(s, _)| s["inuse_bytes"].as_u64())
        .sum();
    let want: u64 = (0..100u64).map(|i| 65536 + (i % 7) * 4096).sum::<u64>() * 20;
    assert_eq!(
        (objects, bytes),
        (2000, want),
        "in use (objects, bytes):\n{all}"
    );
    for (_, frames) in &leaky {
        let at = frames
            .iter()
            .position(|(f, _)| f.contains("leakyFunctionName"))
            .expect("named");
        assert_eq!(frames[at].1, "[jit]", "{frames:?}");
        assert!(
            frames[..at].iter().any(|(f, _)| f.contains("node::Buffer")),
            "the JS function above node's native frames: {frames:?}"
        );
    }
    // Every buffer's stack reaches `_start` (the script allocates only in
    // JIT code that ran before the attach: JIT memory mapped since the
    // maps were read sends walks to user space, docs/jit-names.md).
    for (s, frames) in &leaky {
        assert_eq!(s["truncated"], false, "{frames:?}");
        assert_eq!(
            frames.last().map(|f| f.0.as_str()),
            Some("_start"),
            "{frames:?}"
        );
        assert!(
            frames.iter().any(|(f, _)| f == "node::Start(int, char**)"),
            "{frames:?}"
        );
    }
}

/// A perf map that is a symbolic link (to a file of the process's own) is
/// not read: its frame stays `[unknown]`, and a note says a file was
/// refused and why, where before nothing said why the name was missing.
#[test]
fn a_perf_map_that_is_a_symlink_is_refused_and_the_report_says_so() {
    let bin = compile_c("anon_code", "O2", O2_FLAGS);
    let mut target = Target::start(&bin, &["10", "symlink"]);
    let pid = target.pid();
    let files = [
        format!("/tmp/perf-{pid}.map"),
        format!("/tmp/anon_code-{pid}.real"),
    ];
    let pid = pid.to_string();
    let tracer = JsonTracer::start("jit-symlink", &["--pid", pid.as_str()]);
    target.run_sites();
    let (report, _) = tracer.stop();
    drop(target);
    for f in &files {
        let _ = std::fs::remove_file(f);
    }
    let stack = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| names(s).first().is_some_and(|(f, _)| f == "anon_site"))
        .unwrap_or_else(|| panic!("no anon_site stack: {report:#}"));
    let frames = names(stack);
    assert_eq!(frames[1].0, "[unknown]", "{frames:?}");
    assert_eq!(frames[2].0, "main", "{frames:?}");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("JIT names incomplete, frames in the code concerned stay [unknown]: 1 perf map or jitdump file was refused (a symbolic link"),
        "{notes}"
    );
}
