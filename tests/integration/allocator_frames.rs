//! A Rust program built with debug info: its stacks open with the frames
//! std's allocation code inlined into the caller (`alloc::raw_vec`,
//! `alloc::alloc`, ...). The text report leads with the caller and counts
//! those frames on its line; JSON and collapsed keep every frame.

use crate::harness::{compile_rust_as, function_names, sites::trace_formats};

/// The frames of the text report's stacks, one list per stack, as printed.
fn text_stacks(text: &str) -> Vec<Vec<&str>> {
    let mut stacks: Vec<Vec<&str>> = Vec::new();
    let mut in_stack = false;
    for line in text.lines() {
        if line.starts_with('#') {
            stacks.push(Vec::new());
            in_stack = true;
        } else if in_stack && line.starts_with("      ") {
            if let Some(s) = stacks.last_mut() {
                s.push(line.trim());
            }
        } else {
            in_stack = false;
        }
    }
    stacks
}

#[test]
fn rust_stacks_lead_with_the_caller_and_count_the_allocator_frames() {
    let bin = compile_rust_as("rust_allocs", "rust_allocs_g", &["-C", "opt-level=3", "-g"]);
    let r = trace_formats(&bin, &[], "allocator_frames", &[]);
    // JSON keeps every frame: the stack of make_vec opens with std's.
    let stacks = r.json["stacks"].as_array().expect("stacks");
    let make_vec: Vec<Vec<&str>> = stacks
        .iter()
        .map(function_names)
        .filter(|names| names.iter().any(|n| n.ends_with("::make_vec")))
        .collect();
    assert!(
        !make_vec.is_empty(),
        "no stack through make_vec: {stacks:#?}"
    );
    let names = &make_vec[0];
    let first_own = names
        .iter()
        .position(|n| n.ends_with("::make_vec"))
        .expect("make_vec");
    assert!(
        first_own > 0
            && names[..first_own].iter().all(|n| n.starts_with("alloc::")
                || n.starts_with("<alloc::")
                || n.starts_with("__rust")
                || n.starts_with("core::alloc")),
        "JSON: std's allocation frames first: {names:?}"
    );
    assert!(
        r.collapsed.lines().any(|l| l.contains("make_vec;alloc::")),
        "collapsed keeps them: {}",
        r.collapsed
    );
    // The text report: the stack's first line is make_vec, with the count.
    let text = text_stacks(&r.text);
    let shown = text
        .iter()
        .find(|s| s.iter().any(|l| l.contains("::make_vec")))
        .unwrap_or_else(|| panic!("no stack through make_vec in\n{}", r.text));
    let note = format!("(+{first_own} allocator frame");
    assert!(
        shown[0].contains("::make_vec") && shown[0].contains(&note),
        "first frame shown: {:?}, expected make_vec with {note}\n{}",
        shown[0],
        r.text
    );
    assert!(
        !shown.iter().any(|l| l.starts_with("alloc::")),
        "{shown:#?}"
    );
}
