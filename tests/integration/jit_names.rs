//! JIT frames named from the JIT's perf map: node `--perf-basic-prof`
//! running a leaky script (tests/targets/leaky.js), traced by pid while it
//! holds its buffers. The stack crosses V8's JIT frames (frame-pointer
//! steps) and reaches `_start`: node's `main` tail-calls `node::Start`, so
//! `main` is no frame of its own.

use serde_json::Value;

use crate::harness::{target_source, JsonTracer, Target};

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
