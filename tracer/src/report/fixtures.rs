//! Profiles the renderers' tests and golden files are made from.

use std::sync::Arc;

use tracer_common::counter;

use super::*;

pub(super) fn frame(function: &str, module: &str, offset: u64, file: Option<(&str, u32)>) -> Frame {
    Frame {
        function: function.to_string(),
        module: module.to_string(),
        offset,
        file: file.map(|(f, _)| f.to_string()),
        line: file.map(|(_, l)| l),
        inlined: false,
        build_id: None,
    }
}

pub(super) fn inlined(f: Frame) -> Frame {
    Frame { inlined: true, ..f }
}

pub(super) fn counts(
    inuse_bytes: u64,
    inuse_objects: u64,
    alloc_bytes: u64,
    alloc_objects: u64,
) -> Counts {
    Counts {
        inuse_bytes,
        inuse_objects,
        alloc_bytes,
        alloc_objects,
        ..Counts::default()
    }
}

pub(super) const APP: &str = "/opt/demo/bin/server";
pub(super) const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

pub(super) fn libc_hooks() -> Vec<Hook> {
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
pub(super) fn server_root() -> Vec<Frame> {
    vec![
        frame("main", APP, 0x1890, Some(("src/main.c", 88))),
        frame("__libc_start_call_main", LIBC, 0x2a1c9, None),
        frame("_start", APP, 0x10f4, None),
    ]
}

pub(super) fn stack(pid: u32, counts: Counts, leaf: Vec<Frame>) -> StackReport {
    let mut frames = leaf;
    frames.extend(server_root());
    StackReport {
        pid,
        start_time: None,
        exited_group: None,
        counts,
        frames: frames.into_iter().map(Arc::new).collect(),
        truncated: false,
        series: Vec::new(),
        growth_bytes_per_sec: None,
        trend: None,
        temporary: None,
    }
}

/// One process, exact counts: an inlined frame, an unknown frame, a frame
/// whose name holds a ';', two stacks that differ only in an offset, and a
/// stack whose allocations were all freed (65536 bytes of it in use at
/// the peak, 4.25 s into the trace).
pub(super) fn one_process() -> Profile {
    let mut p = one_process_at_end();
    let peaks = [(36000, 9), (8192, 2), (512, 4), (0, 0), (65536, 16)];
    for (s, (bytes, objects)) in p.stacks.iter_mut().zip(peaks) {
        (s.counts.peak_inuse_bytes, s.counts.peak_inuse_objects) = (bytes, objects);
    }
    (p.totals.peak_inuse_bytes, p.totals.peak_inuse_objects) = (110_240, 31);
    p.processes[0].peak = Some(crate::profile::Peak {
        secs: Some(4.25),
        inuse_bytes: 110_240,
        inuse_objects: 31,
    });
    p
}

fn one_process_at_end() -> Profile {
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
        // 2023-11-14 22:13:20 UTC.
        start_unix_ns: Some(1_700_000_000_000_000_000),
        end_reason: "duration elapsed".to_string(),
        sample_rate: 1,
        unwind: "fp".to_string(),
        processes: vec![ProcessInfo {
            pid: 4242,
            start_time: None,
            folded: 0,
            oom_killed: None,
            temporary: None,
            memory: None,
            identity: Default::default(),
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
            peak: None,
        }],
        hooks: libc_hooks(),
        totals: counts(44864, 17, 1_097_536, 274),
        stacks,
        not_freed_at_exit: Default::default(),
        losses: Losses::default()
            .with(counter::UNKNOWN_FREE, 12)
            .with(counter::RETURN_WITHOUT_ENTRY, 1),
        notes: vec!["pvalloc, memalign: not hooked (optional)".into()],
        snapshots: Vec::new(),
        min_age_secs: None,
        oom_kills: 0,
        temporary: None,
        group_by: Default::default(),
        cgroup_memory: None,
    }
}

/// Two processes of one binary, sampled, with real losses and a stack that
/// was not captured.
pub(super) fn two_processes() -> Profile {
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
            frames: vec![frame("[unknown]", "[unknown]", 0x7f00_dead_beef, None).into()].into(),
            // An unwind that stopped at an address without unwind info.
            truncated: true,
            series: Vec::new(),
            growth_bytes_per_sec: None,
            trend: None,
            temporary: None,
        },
        StackReport {
            pid: 0,
            start_time: None,
            exited_group: Some("/opt/demo/bin/server".into()),
            counts: counts(0, 0, 3_000_000, 30),
            frames: vec![frame("alloc_table", APP, 0x1500, Some(("src/table.c", 9))).into()].into(),
            truncated: false,
            series: Vec::new(),
            growth_bytes_per_sec: None,
            trend: None,
            temporary: None,
        },
        StackReport {
            pid: 102,
            start_time: None,
            exited_group: None,
            counts: counts(524_288, 1, 524_288, 1),
            frames: crate::profile::Frames::default(),
            truncated: false,
            series: Vec::new(),
            growth_bytes_per_sec: None,
            trend: None,
            temporary: None,
        },
    ];
    Profile {
        target: "binary /opt/demo/bin/server".to_string(),
        duration_secs: 3.25,
        // A profile that does not say when it started (an older file).
        start_unix_ns: None,
        end_reason: "interrupted (SIGINT)".to_string(),
        sample_rate: 524_288,
        unwind: "fp".to_string(),
        processes: two_processes_list(),
        hooks: libc_hooks()[..5].to_vec(),
        totals: counts(3_745_728, 7, 7_270_016, 38),
        stacks,
        not_freed_at_exit: two_processes_at_exit(),
        losses: Losses::default()
            .with(counter::RINGBUF_FULL, 3)
            .with(counter::STACK_LOST, 1)
            .with(counter::UNKNOWN_FREE, 40)
            .with(counter::INFLIGHT_FULL, 2)
            .with(counter::FREE_DROPPED, 1)
            .with(counter::FREE_OF_DROPPED_ALLOC, 1),
        notes: Vec::new(),
        snapshots: Vec::new(),
        min_age_secs: None,
        oom_kills: 0,
        temporary: None,
        group_by: Default::default(),
        cgroup_memory: None,
    }
}

/// A trace that saw nothing (e.g. the target exited at once).
pub(super) fn empty() -> Profile {
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
            oom_killed: None,
            temporary: None,
            command: String::new(),
            program: String::new(),
            exited: true,
            exit_status: None,
            allocators: Vec::new(),
            peak: None,
            memory: None,
            identity: Default::default(),
        }],
        ..Profile::default()
    }
}

pub(super) fn fixtures() -> [(&'static str, Profile); 3] {
    [
        ("one_process", one_process()),
        ("two_processes", two_processes()),
        ("empty", empty()),
    ]
}

/// A profile whose every target-controlled string holds terminal escapes,
/// newlines, XML metacharacters and a forged folded line.
pub(super) fn hostile() -> Profile {
    let evil = "ev\x1b]0;owned\x07il\n#1  999 bytes <&> \u{9b}2J";
    let mut p = two_processes();
    p.target = format!("pid 101 ({evil})");
    p.processes[0].command = format!("/opt/{evil} --x");
    p.processes[0].program = format!("/opt/my dir/{evil}");
    p.processes[0].allocators[0].path = format!("/lib/{evil}.so");
    p.hooks[0].module = format!("/lib/{evil}.so");
    p.notes.push(Note::HookFailed {
        pid: 101,
        why: evil.to_string(),
    });
    let f = Arc::make_mut(&mut p.stacks[0].frames[0]);
    f.function = format!("leaf;{evil} 12");
    f.file = Some(format!("{evil}.c"));
    p.not_freed_at_exit.stacks[0].program = format!("/opt/{evil}");
    p
}

/// Two processes and a folded group of 812 exited ones.
fn two_processes_list() -> Vec<ProcessInfo> {
    vec![
        ProcessInfo {
            pid: 101,
            start_time: None,
            folded: 0,
            oom_killed: None,
            temporary: None,
            memory: None,
            identity: Default::default(),
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
            peak: None,
        },
        ProcessInfo {
            pid: 102,
            start_time: None,
            folded: 0,
            oom_killed: None,
            temporary: None,
            memory: None,
            identity: Default::default(),
            command: "/opt/demo/bin/server --worker".to_string(),
            program: String::new(),
            exited: true,
            exit_status: None,
            allocators: Vec::new(),
            peak: None,
        },
        ProcessInfo {
            pid: 0,
            program: "/opt/demo/bin/server".into(),
            exited: true,
            folded: 812,
            oom_killed: None,
            temporary: None,
            ..ProcessInfo::default()
        },
    ]
}

/// What exited processes had not freed, in two stacks.
fn two_processes_at_exit() -> NotFreedAtExit {
    NotFreedAtExit {
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
                frames: crate::profile::Frames::default(),
                truncated: true,
            },
        ],
        stacks_left_out: 0,
    }
}
