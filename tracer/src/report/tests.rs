//! Golden-file tests for the renderers. Bless with
//! `MEMTRACE_BLESS=1 cargo test -p memtrace-bpf report`, then read the diff.

use std::{fs, path::PathBuf, sync::Arc};

use super::*;
use crate::report::fixtures::*;

mod escaping;
mod json_report;
mod speedscope;

const BLESS_VAR: &str = "MEMTRACE_BLESS";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the golden file `name`, or rewrites the file when
/// blessing.
pub(super) fn check_golden(name: &str, actual: &[u8]) {
    let path = golden_dir().join(name);
    if std::env::var(BLESS_VAR).as_deref() == Ok("1") {
        fs::create_dir_all(golden_dir()).expect("create golden dir");
        fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read golden file {}: {e}\n\
             create it with: {BLESS_VAR}=1 cargo test -p memtrace-bpf report",
            path.display()
        )
    });
    if expected != actual {
        panic!(
            "output differs from golden file {}\n--- expected\n{}\n--- actual\n{}\n\
             if the change is intended, bless it with: \
             {BLESS_VAR}=1 cargo test -p memtrace-bpf report",
            path.display(),
            String::from_utf8_lossy(&expected),
            String::from_utf8_lossy(actual),
        );
    }
}

fn text(p: &Profile, top: usize) -> Vec<u8> {
    let mut out = Vec::new();
    write_text(p, top, &mut out).expect("write_text");
    out
}

fn collapsed(p: &Profile, view: View) -> Vec<u8> {
    let mut out = Vec::new();
    write_collapsed(p, view, &mut out).expect("write_collapsed");
    out
}

fn flamegraph(p: &Profile, view: View) -> String {
    let mut out = Vec::new();
    write_flamegraph(p, view, &mut out).expect("write_flamegraph");
    String::from_utf8(out).expect("SVG is UTF-8")
}

#[test]
fn text_matches_golden() {
    for (name, p) in fixtures() {
        check_golden(&format!("{name}.txt"), &text(&p, 10));
    }
}

#[test]
fn text_truncated_by_top_matches_golden() {
    check_golden("one_process.top2.txt", &text(&one_process(), 2));
}

#[test]
fn text_without_inuse_falls_back_to_allocated() {
    let mut p = one_process();
    for stack in &mut p.stacks {
        stack.counts.inuse_bytes = 0;
        stack.counts.inuse_objects = 0;
    }
    check_golden("all_freed.txt", &text(&p, 3));
}

/// The text report as `render` writes it for `view` (sorted by in-use).
fn text_in_view(p: &Profile, view: View, top: usize) -> String {
    let options = RenderOptions {
        format: Format::Text,
        view,
        top,
        sort: Sort::Inuse,
    };
    let mut out = Vec::new();
    render(p, &options, &mut out).expect("render text");
    String::from_utf8(out).expect("UTF-8")
}

#[test]
fn text_in_the_alloc_space_view_matches_golden() {
    let out = text_in_view(&one_process(), View::AllocSpace, 10);
    check_golden("one_process.alloc_space.txt", out.as_bytes());
}

#[test]
fn text_in_the_default_view_is_the_plain_text_report() {
    for (_, p) in fixtures() {
        let out = text_in_view(&p, View::InuseSpace, 10);
        assert_eq!(out.as_bytes(), text(&p, 10), "{out}");
    }
}

/// The stack headings of the main list (before the peak section).
fn headings(out: &str) -> Vec<&str> {
    let main = out.split("Heap at its peak").next().unwrap_or_default();
    main.lines().filter(|l| l.starts_with('#')).collect()
}

#[test]
fn text_ranks_stacks_by_the_view_with_its_number_first() {
    let p = one_process();
    let out = text_in_view(&p, View::AllocObjects, 10);
    assert!(out.contains("Top stacks by allocated objects:\n"), "{out}");
    // Every stack, freed or not: all of them allocated during the trace.
    assert_eq!(
        headings(&out),
        [
            "#1  256 objects, 1048576 bytes allocated (in use: 0 objects, 0 bytes) pid 4242",
            "#2  10 objects, 40000 bytes allocated (in use: 10 objects, 40000 bytes) pid 4242",
            "#3  4 objects, 512 bytes allocated (in use: 4 objects, 512 bytes) pid 4242",
            "#4  2 objects, 8192 bytes allocated (in use: 1 object, 4096 bytes) pid 4242",
            "#5  2 objects, 256 bytes allocated (in use: 2 objects, 256 bytes) pid 4242",
        ],
        "{out}"
    );
    assert!(
        !out.contains("with nothing left in use not listed"),
        "{out}"
    );

    let out = text_in_view(&p, View::InuseObjects, 10);
    assert!(out.contains("Top stacks by in-use objects:\n"), "{out}");
    assert_eq!(
        headings(&out),
        [
            "#1  10 objects, 40000 bytes (allocated: 10 objects, 40000 bytes) pid 4242",
            "#2  4 objects, 512 bytes (allocated: 4 objects, 512 bytes) pid 4242",
            "#3  2 objects, 256 bytes (allocated: 2 objects, 256 bytes) pid 4242",
            "#4  1 object, 4096 bytes (allocated: 2 objects, 8192 bytes) pid 4242",
        ],
        "{out}"
    );
    assert!(
        out.contains("1 stack with nothing left in use not listed"),
        "{out}"
    );

    let out = text_in_view(&p, View::AllocSpace, 2);
    assert_eq!(
        headings(&out),
        [
            "#1  1048576 bytes in 256 objects allocated (in use: 0 bytes in 0 objects) pid 4242",
            "#2  40000 bytes in 10 objects allocated (in use: 40000 bytes in 10 objects) pid 4242",
        ],
        "{out}"
    );
    assert!(out.contains("3 more stacks not shown (--top)"), "{out}");
}

#[test]
fn collapsed_matches_golden() {
    let views = [
        (View::InuseSpace, "inuse_space"),
        (View::AllocObjects, "alloc_objects"),
    ];
    for (name, p) in fixtures() {
        for (view, view_name) in views {
            check_golden(&format!("{name}.{view_name}.folded"), &collapsed(&p, view));
        }
    }
}

#[test]
fn json_matches_golden() {
    for (name, p) in fixtures() {
        let mut out = Vec::new();
        write_json(&p, &mut out).expect("write_json");
        check_golden(&format!("{name}.json"), &out);
    }
}

#[test]
fn flamegraph_is_svg_with_frame_names() {
    let svg = flamegraph(&one_process(), View::InuseSpace);
    assert!(
        svg.starts_with("<?xml"),
        "not XML: {}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("memtrace-bpf: in-use bytes — pid 4242"));
    for name in [
        "main",
        "read_request",
        "buf_new",
        "[unknown] libplugin.so+0x8f3c",
    ] {
        assert!(svg.contains(name), "frame {name} missing from SVG");
    }
    // C++/Rust generics must be escaped, and ';' must not split the frame.
    assert!(svg.contains("lookup&lt;[u8: 8]&gt;"));
    // A stack that exists only in the allocated view is absent here.
    assert!(!svg.contains("parse_config"));
}

#[test]
fn flamegraph_accepts_names_with_spaces() {
    // inferno reads the count after the last space; names may hold spaces.
    let mut p = empty();
    for (leaf, bytes) in [("work", 9), ("work (.cold)", 1)] {
        p.stacks.push(stack(
            7,
            counts(bytes, 1, bytes, 1),
            vec![frame(leaf, APP, 0x10, None)],
        ));
    }
    assert!(flamegraph(&p, View::InuseSpace).contains("work (.cold)"));
}

#[test]
fn flamegraph_is_deterministic() {
    let p = two_processes();
    assert_eq!(
        flamegraph(&p, View::AllocSpace),
        flamegraph(&p, View::AllocSpace)
    );
    assert!(flamegraph(&p, View::AllocSpace).contains("server (pid 101)"));
}

#[test]
fn flamegraph_of_empty_profile_is_valid_svg() {
    let svg = flamegraph(&empty(), View::InuseObjects);
    assert!(svg.starts_with("<?xml"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("no allocations recorded (in-use objects)"));
    // The target is user input and must be escaped.
    let p = Profile {
        target: "<&>".to_string(),
        ..empty()
    };
    assert!(flamegraph(&p, View::InuseSpace).contains("&lt;&amp;&gt;"));
}

/// No control character but the newlines that end lines.
fn assert_no_raw_controls(out: &str) {
    let bad: Vec<char> = out
        .chars()
        .filter(|&c| c != '\n' && (c.is_control() || c == '\u{202e}'))
        .collect();
    assert!(bad.is_empty(), "raw control characters {bad:?} in:\n{out}");
}

#[test]
fn process_label_keeps_a_path_with_spaces_whole() {
    let mut p = empty();
    p.processes[0].command = "/opt/my app/server --port 1".into();
    // Without `program`, the first word stands in.
    assert_eq!(p.process_label(7, None), "my (pid 7)");
    p.processes[0].program = "/opt/my app/server".into();
    assert_eq!(p.process_label(7, None), "server (pid 7)");
    p.processes[0].program = "/opt/my dir/my server".into();
    assert_eq!(p.process_label(7, None), "my server (pid 7)");
}

#[test]
fn text_lists_the_first_processes_and_counts_the_rest() {
    let mut p = two_processes();
    p.processes = (0..30u32)
        .map(|i| ProcessInfo {
            pid: 1000 + i,
            command: if i == 1 {
                String::new()
            } else {
                "/bin/prog -x".into()
            },
            program: "/bin/prog".into(),
            exited: i % 3 == 0,
            ..ProcessInfo::default()
        })
        .collect();
    let out = String::from_utf8(text(&p, 10)).expect("UTF-8");
    let listed = out.lines().filter(|l| l.contains(" /bin/prog")).count();
    assert_eq!(listed, 12, "{out}");
    assert!(out.contains("1001  /bin/prog (arguments unknown)"), "{out}");
    // 18 not listed: 1012..1029, of which 1014, 1017, ..., 1029 exited.
    assert!(
        out.contains("... 18 more processes (6 exited; --format json lists them all)"),
        "{out}"
    );
}
