//! Golden-file tests for the renderers. Bless with
//! `MEMTRACE_BLESS=1 cargo test -p memtrace-bpf report`, then read the diff.

use std::{fs, path::PathBuf, sync::Arc};

use super::*;

const BLESS_VAR: &str = "MEMTRACE_BLESS";

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// Compares `actual` with the golden file `name`, or rewrites the file when
/// blessing.
fn check_golden(name: &str, actual: &[u8]) {
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

fn frame(function: &str, module: &str, offset: u64, file: Option<(&str, u32)>) -> Frame {
    Frame {
        function: function.to_string(),
        module: module.to_string(),
        offset,
        file: file.map(|(f, _)| f.to_string()),
        line: file.map(|(_, l)| l),
        inlined: false,
    }
}

fn inlined(f: Frame) -> Frame {
    Frame { inlined: true, ..f }
}

fn counts(inuse_bytes: u64, inuse_objects: u64, alloc_bytes: u64, alloc_objects: u64) -> Counts {
    Counts {
        inuse_bytes,
        inuse_objects,
        alloc_bytes,
        alloc_objects,
    }
}

const APP: &str = "/opt/demo/bin/server";
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

fn libc_hooks() -> Vec<Hook> {
    let hook = |function: &str, offset, status: &str| Hook {
        function: function.to_string(),
        module: LIBC.to_string(),
        offset,
        probe_offset: offset,
        placement: "symbol: `push r12` is emulated".to_string(),
        status: status.to_string(),
    };
    vec![
        hook("malloc", 0xa50a0, "attached (uprobe session)"),
        hook("calloc", 0xa6b10, "attached (uprobe session)"),
        hook("realloc", 0xa5bc0, "attached (uprobe session)"),
        hook("free", 0xa56e0, "attached"),
        hook("posix_memalign", 0xa7300, "attached"),
        hook("pvalloc", 0, "not defined in this libc"),
        hook("memalign", 0, "not defined in this libc"),
    ]
}

/// Tail shared by the stacks of `server`: main called from libc's start.
fn server_root() -> Vec<Frame> {
    vec![
        frame("main", APP, 0x1890, Some(("src/main.c", 88))),
        frame("__libc_start_call_main", LIBC, 0x2a1c9, None),
        frame("_start", APP, 0x10f4, None),
    ]
}

fn stack(pid: u32, counts: Counts, leaf: Vec<Frame>) -> StackReport {
    let mut frames = leaf;
    frames.extend(server_root());
    StackReport {
        pid,
        start_time: None,
        exited_group: None,
        counts,
        frames: frames.into_iter().map(Arc::new).collect(),
        truncated: false,
    }
}

/// One process, exact counts: an inlined frame, an unknown frame, a frame
/// whose name holds a ';', two stacks that differ only in an offset, and a
/// stack whose allocations were all freed.
fn one_process() -> Profile {
    let cache = frame("cache_insert", APP, 0x1420, Some(("src/cache.c", 31)));
    let stacks = vec![
        stack(
            4242,
            counts(40000, 10, 40000, 10),
            vec![
                inlined(frame("buf_new", APP, 0x1311, Some(("src/buf.h", 12)))),
                frame("read_request", APP, 0x1311, Some(("src/net.c", 57))),
            ],
        ),
        stack(
            4242,
            counts(4096, 1, 8192, 2),
            vec![
                frame("[unknown]", "/opt/demo/lib/libplugin.so", 0x8f3c, None),
                frame("load_plugins", APP, 0x1702, Some(("src/plugin.c", 20))),
            ],
        ),
        stack(
            4242,
            counts(512, 4, 512, 4),
            vec![cache.clone(), frame("lookup<[u8; 8]>", APP, 0x1600, None)],
        ),
        stack(
            4242,
            counts(256, 2, 256, 2),
            vec![
                Frame {
                    offset: 0x1428,
                    ..cache
                },
                frame("lookup<[u8; 8]>", APP, 0x1600, None),
            ],
        ),
        stack(
            4242,
            counts(0, 0, 1 << 20, 256),
            vec![frame("parse_config", APP, 0x1a00, None)],
        ),
    ];
    Profile {
        target: "pid 4242".to_string(),
        duration_secs: 10.004,
        end_reason: "duration elapsed".to_string(),
        sample_rate: 1,
        unwind: "fp".to_string(),
        processes: vec![ProcessInfo {
            pid: 4242,
            start_time: None,
            folded: 0,
            command: "/opt/demo/bin/server --port 8080".to_string(),
            program: String::new(),
            exited: false,
            exit_status: None,
            allocators: vec![ProcessAllocator {
                kind: "glibc".into(),
                path: LIBC.into(),
                resolves_malloc: true,
                functions: vec!["malloc".into(), "free".into()],
            }],
        }],
        hooks: libc_hooks(),
        totals: counts(44864, 17, 1_097_536, 274),
        stacks,
        not_freed_at_exit: Default::default(),
        losses: Losses {
            unknown_frees: 12,
            return_without_entry: 1,
            ..Losses::default()
        },
        notes: vec!["pvalloc, memalign: not hooked (optional)".to_string()],
    }
}

/// Two processes of one binary, sampled, with real losses and a stack that
/// was not captured.
fn two_processes() -> Profile {
    let stacks = vec![
        stack(
            101,
            counts(1_572_864, 3, 2_097_152, 4),
            vec![frame("alloc_table", APP, 0x1500, Some(("src/table.c", 9)))],
        ),
        stack(
            102,
            counts(1_048_576, 2, 1_048_576, 2),
            vec![frame("alloc_table", APP, 0x1500, Some(("src/table.c", 9)))],
        ),
        StackReport {
            pid: 103,
            start_time: None,
            exited_group: None,
            counts: counts(600_000, 1, 600_000, 1),
            frames: vec![frame("[unknown]", "[unknown]", 0x7f00_dead_beef, None).into()],
            // An unwind that stopped at an address without unwind info.
            truncated: true,
        },
        StackReport {
            pid: 0,
            start_time: None,
            exited_group: Some("/opt/demo/bin/server".into()),
            counts: counts(0, 0, 3_000_000, 30),
            frames: vec![frame("alloc_table", APP, 0x1500, Some(("src/table.c", 9))).into()],
            truncated: false,
        },
        StackReport {
            pid: 102,
            start_time: None,
            exited_group: None,
            counts: counts(524_288, 1, 524_288, 1),
            frames: Vec::new(),
            truncated: false,
        },
    ];
    Profile {
        target: "binary /opt/demo/bin/server".to_string(),
        duration_secs: 3.25,
        end_reason: "interrupted (SIGINT)".to_string(),
        sample_rate: 524_288,
        unwind: "fp".to_string(),
        processes: vec![
            ProcessInfo {
                pid: 101,
                start_time: None,
                folded: 0,
                command: "/opt/demo/bin/server --worker".to_string(),
                program: String::new(),
                exited: false,
                exit_status: None,
                allocators: vec![
                    ProcessAllocator {
                        kind: "jemalloc".into(),
                        path: "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2".into(),
                        resolves_malloc: true,
                        functions: vec!["malloc".into(), "mallocx".into(), "free".into()],
                    },
                    ProcessAllocator {
                        kind: "mimalloc".into(),
                        path: APP.into(),
                        resolves_malloc: false,
                        functions: vec!["mi_malloc".into()],
                    },
                ],
            },
            ProcessInfo {
                pid: 102,
                start_time: None,
                folded: 0,
                command: "/opt/demo/bin/server --worker".to_string(),
                program: String::new(),
                exited: true,
                exit_status: None,
                allocators: Vec::new(),
            },
            ProcessInfo {
                pid: 0,
                program: "/opt/demo/bin/server".into(),
                exited: true,
                folded: 812,
                ..ProcessInfo::default()
            },
        ],
        hooks: libc_hooks()[..5].to_vec(),
        totals: counts(3_745_728, 7, 7_270_016, 38),
        stacks,
        not_freed_at_exit: NotFreedAtExit {
            processes: 2,
            bytes: 12_288,
            objects: 3,
            stacks: vec![
                ExitStack {
                    program: "/opt/demo/bin/server".into(),
                    processes: 2,
                    bytes: 8192,
                    objects: 2,
                    frames: [frame(
                        "read_config",
                        APP,
                        0x1c00,
                        Some(("src/config.c", 30)),
                    )]
                    .into_iter()
                    .chain(server_root())
                    .map(Arc::new)
                    .collect(),
                    truncated: false,
                },
                ExitStack {
                    program: String::new(),
                    processes: 1,
                    bytes: 4096,
                    objects: 1,
                    frames: Vec::new(),
                    truncated: true,
                },
            ],
            stacks_left_out: 0,
        },
        losses: Losses {
            ringbuf_full: 3,
            live_map_full: 0,
            stack_lost: 1,
            unknown_frees: 40,
            return_without_entry: 0,
            inflight_full: 2,
            read_failed: 0,
            stale_inflight: 0,
        },
        notes: Vec::new(),
    }
}

/// A trace that saw nothing (e.g. the target exited at once).
fn empty() -> Profile {
    Profile {
        target: "pid 7".to_string(),
        duration_secs: 0.5,
        end_reason: "target exited".to_string(),
        sample_rate: 1,
        unwind: "fp".to_string(),
        processes: vec![ProcessInfo {
            pid: 7,
            start_time: None,
            folded: 0,
            command: String::new(),
            program: String::new(),
            exited: true,
            exit_status: None,
            allocators: Vec::new(),
        }],
        ..Profile::default()
    }
}

fn fixtures() -> [(&'static str, Profile); 3] {
    [
        ("one_process", one_process()),
        ("two_processes", two_processes()),
        ("empty", empty()),
    ]
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

/// A profile whose every target-controlled string holds terminal escapes,
/// newlines, XML metacharacters and a forged folded line.
fn hostile() -> Profile {
    let evil = "ev\x1b]0;owned\x07il\n#1  999 bytes <&> \u{9b}2J";
    let mut p = two_processes();
    p.target = format!("pid 101 ({evil})");
    p.processes[0].command = format!("/opt/{evil} --x");
    p.processes[0].program = format!("/opt/my dir/{evil}");
    p.processes[0].allocators[0].path = format!("/lib/{evil}.so");
    p.hooks[0].module = format!("/lib/{evil}.so");
    p.notes.push(format!(
        "process 101: its allocator could not be hooked: {evil}"
    ));
    let f = Arc::make_mut(&mut p.stacks[0].frames[0]);
    f.function = format!("leaf;{evil} 12");
    f.file = Some(format!("{evil}.c"));
    p.not_freed_at_exit.stacks[0].program = format!("/opt/{evil}");
    p
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
fn text_escapes_every_target_controlled_string() {
    let p = hostile();
    let out = String::from_utf8(text(&p, 10)).expect("UTF-8");
    assert_no_raw_controls(&out);
    assert!(
        out.contains("ev\\x1b]0;owned\\x07il\\n#1  999 bytes"),
        "{out}"
    );
    assert!(out.contains("\\u{9b}2J"), "{out}");
    // No line was forged: every stack summary line is one of ours.
    let summaries = out.lines().filter(|l| l.starts_with('#')).count();
    let at_exit = p.not_freed_at_exit.stacks.len();
    let inuse = p.stacks.iter().filter(|s| s.counts.inuse_bytes > 0).count();
    assert_eq!(summaries, inuse.min(10) + at_exit, "{out}");
    assert!(out.contains("by 2 processes of ev\\x1b]0;owned"), "{out}");
}

#[test]
fn collapsed_escapes_names_and_keeps_one_line_per_stack() {
    let p = hostile();
    let out = String::from_utf8(collapsed(&p, View::AllocObjects)).expect("UTF-8");
    assert_no_raw_controls(&out);
    let expected = p
        .stacks
        .iter()
        .filter(|s| s.counts.alloc_objects > 0)
        .count();
    // Stacks may merge, never split.
    assert!(out.lines().count() <= expected, "{out}");
    for line in out.lines() {
        let (_, value) = line.rsplit_once(' ').expect("stack VALUE");
        value.parse::<u64>().expect("count after the last space");
        let (_, before) = line[..line.len() - value.len() - 1]
            .rsplit_once(' ')
            .unwrap_or(("", "x"));
        assert!(
            before.parse::<f64>().is_err(),
            "reads as differential: {line}"
        );
    }
    // The process root frame keeps the program's path whole.
    assert!(
        out.contains("ev\\x1b]0:owned\\x07il\\n#1  999 bytes <&> \\u{9b}2J (pid 101);"),
        "{out}"
    );
    assert!(out.contains(";leaf:ev\\x1b]0:owned"), "{out}");
}

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
    for f in p.stacks.iter().flat_map(|s| &s.frames) {
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

#[test]
fn flamegraph_of_hostile_names_is_well_formed_xml() {
    let svg = flamegraph(&hostile(), View::AllocSpace);
    assert_no_raw_controls(&svg);
    assert!(svg.contains("&lt;&amp;&gt;"), "XML metacharacters escaped");
    assert!(!svg.contains("<&>"));
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
