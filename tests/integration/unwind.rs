//! Where frame pointers cannot help: a Rust release build and a stack deeper
//! than the copied window with `--unwind dwarf` (tables.rs has both in
//! tables mode), allocations made inside glibc and a recursion within the
//! window in the default mode (tables).

use serde_json::Value;

use crate::harness::{
    compile_c, compile_rust,
    sites::{trace_formats, O2_FLAGS},
};

fn stacks(report: &Value) -> &[Value] {
    report["stacks"].as_array().expect("stacks array")
}

fn frames(stack: &Value) -> &[Value] {
    stack["frames"].as_array().expect("frames array")
}

/// Function names, leaf first.
fn names(stack: &Value) -> Vec<&str> {
    frames(stack)
        .iter()
        .map(|f| f["function"].as_str().expect("function is a string"))
        .collect()
}

fn count(stack: &Value, key: &str) -> u64 {
    stack[key].as_u64().expect("count is a number")
}

/// Every stack's numbers, truncation and frames (function [module]), for
/// failure messages.
fn describe(report: &Value) -> String {
    let mut out = String::new();
    for s in stacks(report) {
        out.push_str(&format!(
            "inuse {} B / {} objs, alloc {} B / {} objs, truncated {}:\n",
            s["inuse_bytes"],
            s["inuse_objects"],
            s["alloc_bytes"],
            s["alloc_objects"],
            s["truncated"]
        ));
        for f in frames(s) {
            let module = f["module"].as_str().unwrap_or("");
            let module = module.rsplit('/').next().unwrap_or(module);
            out.push_str(&format!("    {} [{module}]\n", f["function"]));
        }
    }
    out.push_str(&format!("notes: {}\n", report["notes"]));
    out
}

fn notes(report: &Value) -> Vec<&str> {
    report["notes"]
        .as_array()
        .expect("notes array")
        .iter()
        .map(|n| n.as_str().expect("note is a string"))
        .collect()
}

/// Rust's release profile (`-C opt-level=3`: no frame pointers, no debug
/// info of its own) allocating through std's system allocator: each leaked
/// allocation is found under the function that made it, on a complete stack
/// up through std's runtime to C's `main`.
#[test]
fn rust_release_build_unwinds_through_std_to_main() {
    let bin = compile_rust("rust_allocs", &["-C", "opt-level=3"]);
    let r = trace_formats(&bin, &[], "rust_allocs", &["--unwind", "dwarf"]);
    let report = &r.json;
    assert_eq!(report["unwind"], "dwarf");
    let all = describe(report);
    for func in ["make_vec", "make_box", "make_string", "fill_map"] {
        let suffix = format!("::{func}");
        let mine: Vec<&Value> = stacks(report)
            .iter()
            .filter(|s| names(s).iter().any(|n| n.ends_with(&suffix)))
            .collect();
        assert!(!mine.is_empty(), "no stack through *{suffix}:\n{all}");
        for s in &mine {
            let names = names(s);
            assert!(names.contains(&"main"), "{func}: no main in {names:?}");
            assert_eq!(s["truncated"], false, "{func}: {names:?}");
        }
        // Summed over every stack through the function (whether or not
        // std's allocation shims show as frames of their own).
        let sum = |key| mine.iter().map(|s| count(s, key)).sum::<u64>();
        let (inuse, objects) = (sum("inuse_bytes"), sum("inuse_objects"));
        let (alloc, alloc_objects) = (sum("alloc_bytes"), sum("alloc_objects"));
        match func {
            // Vec::<u64>::with_capacity(1000): malloc(8000), nothing added
            // by Rust's allocator. Box<[u8; 4096]>: malloc(4096).
            // String::with_capacity(300): malloc(300).
            "make_vec" | "make_box" | "make_string" => {
                let size = match func {
                    "make_vec" => 8000,
                    "make_box" => 4096,
                    _ => 300,
                };
                assert_eq!(
                    [inuse, objects, alloc, alloc_objects],
                    [size, 1, size, 1],
                    "{func}: [inuse bytes, inuse objects, alloc bytes, alloc objects]:\n{all}"
                );
            }
            // The table grows by reallocation while 100 entries are
            // inserted: one table (at least 100 * 16 bytes of entries)
            // stays, the smaller ones were freed. (Observed with Rust 1.95:
            // 128 buckets, 2192 bytes live, 6 tables, 4380 bytes in all.)
            _ => {
                assert_eq!(objects, 1, "{func}: one table stays:\n{all}");
                assert!(inuse >= 100 * 16, "{func}: {inuse} bytes:\n{all}");
                assert!(alloc_objects > 1, "{func}: the table grew:\n{all}");
                assert!(alloc > inuse, "{func}: smaller tables freed:\n{all}");
            }
        }
    }
    // The allocating function itself called the allocator: std's
    // __rust_alloc shims tail-call malloc.
    let leaf_vec = stacks(report)
        .iter()
        .find(|s| names(s).first().is_some_and(|n| n.ends_with("::make_vec")))
        .unwrap_or_else(|| panic!("no stack with make_vec as frames[0]:\n{all}"));
    assert_eq!(count(leaf_vec, "inuse_bytes"), 8000, "{all}");
    assert_eq!(count(leaf_vec, "inuse_objects"), 1, "{all}");
}

/// -O2 without frame pointers, allocations made by glibc inside strdup,
/// fopen and getline: frames[0] is in libc (which has no frame pointers
/// either), and the walk continues out of it to the caller and `main`.
#[test]
fn allocations_inside_glibc_unwind_out_to_the_caller_and_main() {
    let bin = compile_c("glibc_internals", "O2", O2_FLAGS);
    let r = trace_formats(&bin, &[], "glibc_internals-O2", &[]);
    let report = &r.json;
    let all = describe(report);
    let in_libc = |f: &Value| f["module"].as_str().is_some_and(|m| m.contains("libc.so"));
    for func in ["call_strdup", "call_fopen", "call_getline"] {
        let mine: Vec<&Value> = stacks(report)
            .iter()
            .filter(|s| {
                let names = names(s);
                frames(s).first().is_some_and(in_libc)
                    && names
                        .windows(2)
                        .skip(1)
                        .any(|w| w[0] == func && w[1] == "main")
            })
            .collect();
        assert!(
            !mine.is_empty(),
            "no stack from inside libc through {func} to main:\n{all}"
        );
        for s in &mine {
            assert_eq!(s["truncated"], false, "{func}: {:?}", names(s));
            assert!(count(s, "inuse_objects") >= 1, "{func}: leaked:\n{all}");
        }
        if func == "call_strdup" {
            // strdup of 100 characters: one malloc(101).
            let inuse: Vec<[u64; 2]> = mine
                .iter()
                .map(|s| [count(s, "inuse_bytes"), count(s, "inuse_objects")])
                .collect();
            assert_eq!(inuse, [[101, 1]], "{func}:\n{all}");
        }
    }
    // Nothing in this program is deeper than the copied window.
    for s in stacks(report) {
        assert_eq!(s["truncated"], false, "{:?}\n{all}", names(s));
    }
}

/// The stack of the malloc at the bottom of `recurse`, the only one.
fn recursion_stack(report: &Value) -> &Value {
    let mine: Vec<&Value> = stacks(report)
        .iter()
        .filter(|s| names(s).first() == Some(&"recurse"))
        .collect();
    assert_eq!(mine.len(), 1, "one malloc stack:\n{}", describe(report));
    assert_eq!(count(mine[0], "inuse_bytes"), 777);
    assert_eq!(count(mine[0], "inuse_objects"), 1);
    mine[0]
}

/// 200 levels of ~96-byte frames do not fit in the default 8 KiB window: the
/// walk stops inside the recursion, marked truncated in every format, and
/// the notes say which flag copies more.
#[test]
fn recursion_deeper_than_the_copied_stack_is_marked_truncated() {
    let bin = compile_c("recurse", "O2", O2_FLAGS);
    let r = trace_formats(&bin, &["200"], "recurse-200", &["--unwind", "dwarf"]);
    let stack = recursion_stack(&r.json);
    let names = names(stack);
    assert_eq!(stack["truncated"], true, "{names:?}");
    // Only the recursion fits: 8192 bytes hold about 85 of its frames.
    assert!(
        names.iter().all(|n| *n == "recurse"),
        "only recurse frames: {names:?}"
    );
    assert!(
        (50..200).contains(&names.len()),
        "{} frames: {names:?}",
        names.len()
    );
    assert!(!names.contains(&"main"), "{names:?}");
    assert!(
        notes(&r.json)
            .iter()
            .any(|n| n.contains("--stack-bytes") && n.contains("[truncated]")),
        "notes: {:?}",
        notes(&r.json)
    );
    assert!(
        r.text.contains("[truncated]"),
        "text report lacks [truncated]:\n{}",
        r.text
    );
    assert!(
        r.collapsed
            .lines()
            .any(|l| l.starts_with("[truncated];recurse;") && l.ends_with(";recurse 777")),
        "no collapsed line [truncated];recurse;...;recurse 777:\n{}",
        r.collapsed
    );
}

/// 40 levels fit in the default window: all 40 frames of the recursion,
/// then `main`, not truncated.
#[test]
fn recursion_within_the_copied_stack_unwinds_to_main() {
    let bin = compile_c("recurse", "O2-shallow", O2_FLAGS);
    let r = trace_formats(&bin, &["40"], "recurse-40", &[]);
    let stack = recursion_stack(&r.json);
    let names = names(stack);
    assert_eq!(stack["truncated"], false, "{names:?}");
    assert!(
        names.len() > 40 && names[..40].iter().all(|n| *n == "recurse"),
        "40 recurse frames first: {names:?}"
    );
    assert_eq!(names.get(40), Some(&"main"), "{names:?}");
    assert!(
        !notes(&r.json).iter().any(|n| n.contains("--stack-bytes")),
        "notes: {:?}",
        notes(&r.json)
    );
    assert!(!r.text.contains("[truncated]"), "{}", r.text);
    let chain = format!(";main{} 777", ";recurse".repeat(40));
    assert!(
        r.collapsed.lines().any(|l| l.ends_with(&chain)),
        "no collapsed line ending in {chain:?}:\n{}",
        r.collapsed
    );
}
