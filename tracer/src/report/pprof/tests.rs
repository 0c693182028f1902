//! The pprof file decoded with prost, as a consumer reads it.

use std::io::Read as _;
use std::sync::Arc;

use prost::Message as _;

use super::proto;
use super::*;
use crate::report::{Counts, Losses, ProcessInfo};

const APP: &str = "/opt/demo/bin/server";

fn frame(function: &str, offset: u64, line: u32, inlined: bool) -> Arc<Frame> {
    Arc::new(Frame {
        function: function.to_string(),
        module: APP.to_string(),
        offset,
        file: Some("server.c".to_string()),
        line: Some(line),
        inlined,
        build_id: None,
    })
}

fn stack(pid: u32, frames: Vec<Arc<Frame>>, counts: Counts, truncated: bool) -> StackReport {
    StackReport {
        pid,
        start_time: Some(100 + u64::from(pid)),
        exited_group: None,
        counts,
        frames: frames.into(),
        truncated,
        series: Vec::new(),
        growth_bytes_per_sec: None,
        trend: None,
        temporary: None,
    }
}

fn process(pid: u32, program: &str, command: &str) -> ProcessInfo {
    ProcessInfo {
        pid,
        start_time: Some(100 + u64::from(pid)),
        command: command.to_string(),
        program: program.to_string(),
        ..Default::default()
    }
}

/// Two processes; pid 7's stack has `inner` and `middle` inlined into
/// `outer` at one address, under `main`; pid 8's stack is truncated.
fn profile() -> Profile {
    let main = frame("main", 0x1200, 40, false);
    Profile {
        target: "--binary /opt/demo/bin/server".to_string(),
        duration_secs: 2.5,
        end_reason: "duration elapsed".to_string(),
        sample_rate: 1,
        unwind: "dwarf".to_string(),
        processes: vec![
            process(7, "/opt/demo/bin/server", "/opt/demo/bin/server --port 1"),
            process(8, "/opt/demo/bin/server", "server\x1b[2J --port 2"),
        ],
        stacks: vec![
            stack(
                7,
                vec![
                    frame("inner", 0x1100, 10, true),
                    frame("middle", 0x1100, 20, true),
                    frame("outer", 0x1100, 30, false),
                    main.clone(),
                ],
                Counts {
                    inuse_bytes: 3000,
                    inuse_objects: 3,
                    alloc_bytes: 5000,
                    alloc_objects: 5,
                    ..Counts::default()
                },
                false,
            ),
            stack(
                8,
                vec![frame("outer", 0x1150, 31, false), main],
                Counts {
                    inuse_bytes: 0,
                    inuse_objects: 0,
                    alloc_bytes: 640,
                    alloc_objects: 10,
                    ..Counts::default()
                },
                true,
            ),
            // Nothing to show: left out.
            stack(8, vec![], Counts::default(), false),
        ],
        losses: Losses::default()
            .with(tracer_common::counter::RINGBUF_FULL, 12)
            .with(tracer_common::counter::UNKNOWN_FREE, 3),
        ..Default::default()
    }
}

fn decode(p: &Profile, view: View) -> proto::Profile {
    let mut gz = Vec::new();
    write_pprof(p, view, &mut gz).expect("render pprof");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut raw)
        .expect("the file is gzip");
    proto::Profile::decode(raw.as_slice()).expect("the file is a perftools.profiles.Profile")
}

fn s(pb: &proto::Profile, id: i64) -> &str {
    &pb.string_table[usize::try_from(id).expect("string id")]
}

fn function_name(pb: &proto::Profile, line: &proto::Line) -> String {
    let f = pb
        .function
        .iter()
        .find(|f| f.id == line.function_id)
        .expect("line's function exists");
    assert_eq!(f.system_name, f.name, "system name given");
    s(pb, f.name).to_string()
}

/// Each sample's stack as function names, leaf first, one string per
/// location with its lines joined by `+`.
fn stacks(pb: &proto::Profile) -> Vec<Vec<String>> {
    pb.sample
        .iter()
        .map(|sample| {
            sample
                .location_id
                .iter()
                .map(|id| {
                    let loc = pb.location.iter().find(|l| l.id == *id).expect("location");
                    loc.line
                        .iter()
                        .map(|l| function_name(pb, l))
                        .collect::<Vec<_>>()
                        .join("+")
                })
                .collect()
        })
        .collect()
}

#[test]
fn sample_types_come_in_go_heap_profile_order_with_our_numbers() {
    let pb = decode(&profile(), View::AllocSpace);
    let types: Vec<(&str, &str)> = pb
        .sample_type
        .iter()
        .map(|t| (s(&pb, t.r#type), s(&pb, t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
            ("peak_objects", "count"),
            ("peak_space", "bytes"),
        ]
    );
    let period = pb.period_type.as_ref().expect("period type");
    assert_eq!(
        (s(&pb, period.r#type), s(&pb, period.unit)),
        ("space", "bytes")
    );
    assert_eq!(pb.period, 1);
    assert_eq!(s(&pb, pb.default_sample_type), "alloc_space");
    assert_eq!(pb.duration_nanos, 2_500_000_000);
    assert_eq!(s(&pb, 0), "", "string 0 is empty");
    let values: Vec<&[i64]> = pb.sample.iter().map(|x| x.value.as_slice()).collect();
    assert_eq!(
        values,
        [&[5, 5000, 3, 3000, 0, 0][..], &[10, 640, 0, 0, 0, 0][..]]
    );
    assert_eq!(
        s(
            &decode(&profile(), View::InuseSpace),
            decode(&profile(), View::InuseSpace).default_sample_type
        ),
        "inuse_space"
    );
}

#[test]
fn inlined_frames_fold_into_one_location_innermost_first() {
    let pb = decode(&profile(), View::InuseSpace);
    assert_eq!(
        stacks(&pb),
        [
            vec!["inner+middle+outer", "main"],
            vec!["outer", "main", "[truncated]"],
        ]
    );
    let folded = pb
        .location
        .iter()
        .find(|l| l.line.len() == 3)
        .expect("the inlined location");
    assert_eq!(folded.address, LOAD_BIAS + 0x1100);
    let lines: Vec<i64> = folded.line.iter().map(|l| l.line).collect();
    assert_eq!(lines, [10, 20, 30]);
    // `main` is one location shared by both stacks.
    assert_eq!(pb.location.len(), 4);
    let [mapping] = pb.mapping.as_slice() else {
        panic!("one mapping per object: {:?}", pb.mapping)
    };
    assert_eq!(s(&pb, mapping.filename), APP);
    // The pages of the offsets seen (0x1100..=0x1200), at LOAD_BIAS.
    assert_eq!(
        (
            mapping.memory_start,
            mapping.memory_limit,
            mapping.file_offset
        ),
        (LOAD_BIAS + 0x1000, LOAD_BIAS + 0x2000, 0x1000)
    );
    assert!(mapping.has_functions && mapping.has_inline_frames && mapping.has_line_numbers);
    assert_eq!(s(&pb, mapping.build_id), "", "no such file: no build id");
}

#[test]
fn every_sample_is_labelled_with_its_process_and_block_size() {
    let pb = decode(&profile(), View::InuseSpace);
    let labels: Vec<Vec<(String, String)>> = pb
        .sample
        .iter()
        .map(|sample| {
            sample
                .label
                .iter()
                .map(|l| {
                    let value = match l.str {
                        0 => l.num.to_string(),
                        str => s(&pb, str).to_string(),
                    };
                    (s(&pb, l.key).to_string(), value)
                })
                .collect()
        })
        .collect();
    let own = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        labels,
        [
            own(&[
                ("pid", "7"),
                ("comm", "server"),
                ("command", "/opt/demo/bin/server --port 1"),
                ("bytes", "1000"),
            ]),
            // A command line is escaped before `go tool pprof` prints it.
            own(&[
                ("pid", "8"),
                ("comm", "server"),
                ("command", "server\\x1b[2J --port 2"),
                ("bytes", "64"),
            ]),
        ]
    );
}

#[test]
fn comments_say_what_was_traced_and_every_nonzero_loss() {
    let pb = decode(&profile(), View::InuseSpace);
    let comments: Vec<&str> = pb.comment.iter().map(|c| s(&pb, *c)).collect();
    let has = |needle: &str| comments.iter().any(|c| c.contains(needle));
    assert!(has("--binary /opt/demo/bin/server"), "{comments:#?}");
    assert!(
        has("duration: 2.500 s; ended: duration elapsed"),
        "{comments:#?}"
    );
    assert!(has("sample rate: 1 bytes"), "{comments:#?}");
    assert!(
        has(
            "ringbuf_full: 12 events dropped because the ring buffer was full (raise --ringbuf-mb)"
        ),
        "{comments:#?}"
    );
    assert!(has("unknown_frees: 3"), "{comments:#?}");
    assert!(
        !has("live_map_full"),
        "zero counters are left out: {comments:#?}"
    );
}

#[test]
fn the_time_is_the_traces_start_or_unknown() {
    let mut p = profile();
    p.start_unix_ns = Some(1_700_000_000_123_456_789);
    let pb = decode(&p, View::InuseSpace);
    assert_eq!(pb.time_nanos, 1_700_000_000_123_456_789);
    assert_eq!(pb.duration_nanos, 2_500_000_000);
    // Not the time it is rendered: pprof's 0, "unknown".
    p.start_unix_ns = None;
    assert_eq!(decode(&p, View::InuseSpace).time_nanos, 0);
}

#[test]
fn an_empty_profile_is_still_a_valid_file() {
    let pb = decode(&Profile::default(), View::InuseSpace);
    assert!(pb.sample.is_empty());
    assert_eq!(pb.sample_type.len(), 6);
    assert_eq!(
        pb.period, 1,
        "a 0 rate is shown as exact, as in the text report"
    );
}

#[test]
fn samples_past_one_batch_are_all_written() {
    let mut p = profile();
    let one = p.stacks[0].clone();
    // Each sample is some 40 bytes: several batches.
    p.stacks = (0..(BATCH_BYTES / 10) as u64)
        .map(|i| StackReport {
            frames: vec![frame(&format!("f{i}"), 0x2000 + i, 1, false)].into(),
            ..one.clone()
        })
        .collect();
    let pb = decode(&p, View::InuseSpace);
    assert_eq!(pb.sample.len(), p.stacks.len());
    assert_eq!(pb.location.len(), p.stacks.len());
    let total: i64 = pb.sample.iter().map(|x| x.value[3]).sum();
    assert_eq!(total, 3000 * p.stacks.len() as i64);
}
