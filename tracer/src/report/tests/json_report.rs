//! The JSON report: exact strings, the frame table and its indices, one
//! line per stack.

use super::*;

#[test]
fn json_keeps_the_exact_strings() {
    let p = hostile();
    let mut out = Vec::new();
    write_json(&p, &mut out).expect("write_json");
    let out = String::from_utf8(out).expect("UTF-8");
    assert_no_raw_controls(&out.replace('\n', ""));
    let doc: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(doc["target"], p.target.as_str());
    assert_eq!(
        doc["processes"][0]["command"],
        p.processes[0].command.as_str()
    );
    let leaf = &json_frames(&doc, 0)[0];
    assert_eq!(leaf["function"], p.stacks[0].frames[0].function.as_str());
    assert_eq!(
        leaf["file"],
        p.stacks[0].frames[0].file.as_deref().expect("file")
    );
}

/// The JSON report of `p`, parsed.
fn json(p: &Profile) -> serde_json::Value {
    let mut out = Vec::new();
    write_json(p, &mut out).expect("write_json");
    serde_json::from_slice(&out).expect("valid JSON")
}

/// Stack `i`'s frames in a JSON report, looked up in the frame table.
fn json_frames(doc: &serde_json::Value, i: usize) -> Vec<serde_json::Value> {
    doc["stacks"][i]["frames"]
        .as_array()
        .expect("frame indices")
        .iter()
        .map(|ix| {
            let ix = ix.as_u64().expect("an index") as usize;
            doc["frames"][ix].clone()
        })
        .collect()
}

/// `f` as the JSON report writes it.
fn frame_json(f: &Frame) -> serde_json::Value {
    serde_json::to_value(f).expect("frame to JSON")
}

#[test]
fn json_is_format_2_with_a_frame_table() {
    let doc = json(&one_process());
    assert_eq!(doc["format"], "memtrace-bpf/2");
    assert!(doc["frames"].is_array(), "{doc}");
    assert!(doc["stacks"][0]["frames"][0].is_u64(), "{doc}");
}

#[test]
fn json_frame_indices_resolve_to_each_stacks_frames() {
    for (name, p) in fixtures() {
        let doc = json(&p);
        for (i, stack) in p.stacks.iter().enumerate() {
            let expected: Vec<_> = stack.frames.iter().map(|f| frame_json(f)).collect();
            assert_eq!(json_frames(&doc, i), expected, "{name}: stack {i}");
        }
    }
}

#[test]
fn json_frame_table_holds_each_distinct_frame_once() {
    // The fixtures' stacks hold equal frames in distinct Arcs (the shared
    // root): they are interned by value.
    let p = one_process();
    let doc = json(&p);
    let table = doc["frames"].as_array().expect("table");
    let mut distinct: Vec<serde_json::Value> = Vec::new();
    for f in p.stacks.iter().flat_map(|s| s.frames.iter()) {
        if !distinct.contains(&frame_json(f)) {
            distinct.push(frame_json(f));
        }
    }
    // First appearance, walking the stacks in report order.
    assert_eq!(table, &distinct);
    assert_eq!(table.len(), 11, "{table:#?}");
}

#[test]
fn frame_table_interns_by_pointer_then_by_value() {
    let shared = Arc::new(frame("f", APP, 0x10, None));
    let twin = Arc::new(frame("f", APP, 0x10, None));
    let other = Arc::new(frame("g", APP, 0x20, None));
    let a = vec![shared.clone(), other.clone()];
    let b = vec![twin, shared, other];
    let mut table = json::FrameTable::default();
    assert_eq!(table.index(&a), [0, 1]);
    assert_eq!(table.index(&b), [0, 0, 1]);
    assert_eq!(table.index(&[]), Vec::<u32>::new());
    assert_eq!(table.frames().len(), 2);
    assert_eq!(table.frames()[1].function, "g");
}

#[test]
fn json_writes_each_stack_on_one_line() {
    let p = two_processes();
    let mut out = Vec::new();
    write_json(&p, &mut out).expect("write_json");
    let out = String::from_utf8(out).expect("UTF-8");
    let stack_lines = out.lines().filter(|l| l.contains("\"pid\":")).count();
    // Each process (a folded group included) and each stack on a line.
    assert_eq!(stack_lines, p.processes.len() + p.stacks.len(), "{out}");
}
