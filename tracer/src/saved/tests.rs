use std::{io::Write as _, sync::Arc};

use prost::Message as _;

use super::*;
use crate::report::{proto, Counts, Frame, SnapshotPoint, StackReport, Trend};
use limits::Budget;

mod golden;
mod hostile;
mod sizes;

fn frame(name: &str, module: &str) -> Arc<Frame> {
    Arc::new(Frame {
        function: name.into(),
        module: module.into(),
        offset: 0x10,
        ..Default::default()
    })
}

fn counts(inuse: u64, alloc: u64) -> Counts {
    Counts {
        inuse_bytes: inuse,
        inuse_objects: inuse / 100,
        alloc_bytes: alloc,
        alloc_objects: alloc / 100,
        ..Counts::default()
    }
}

fn stack(pid: u32, c: Counts, frames: &[&Arc<Frame>]) -> StackReport {
    StackReport {
        pid,
        counts: c,
        frames: frames.iter().map(|f| Arc::clone(f)).collect(),
        ..Default::default()
    }
}

/// Given a profile of two stacks (leak under main, cache under main) of
/// process `pid`, with `leak` in-use bytes in the leak.
pub(super) fn profile(pid: u32, leak: u64) -> Profile {
    let (main, lk, cache) = (
        frame("main", "/bin/t"),
        frame("leak", "/bin/t"),
        frame("cache", "/bin/t"),
    );
    let stacks = vec![
        stack(pid, counts(leak, leak), &[&lk, &main]),
        stack(pid, counts(500, 900), &[&cache, &main]),
    ];
    let mut totals = Counts::default();
    for s in &stacks {
        totals.inuse_bytes += s.counts.inuse_bytes;
        totals.inuse_objects += s.counts.inuse_objects;
        totals.alloc_bytes += s.counts.alloc_bytes;
        totals.alloc_objects += s.counts.alloc_objects;
    }
    Profile {
        target: format!("pid {pid}"),
        sample_rate: 1,
        unwind: "dwarf".into(),
        totals,
        stacks,
        ..Default::default()
    }
}

pub(super) fn json_of(p: &Profile) -> Vec<u8> {
    let mut out = Vec::new();
    report::write_json(p, &mut out).expect("render");
    out
}

/// A JSON profile read from `raw` within the usual budget.
pub(super) fn json(raw: &[u8]) -> anyhow::Result<Profile> {
    read_json::parse(raw.to_vec(), &mut Budget::new(MAX_PROFILE_BYTES))
}

/// A pprof profile read from `raw` (decompressed) within the usual budget.
pub(super) fn pprof(raw: &[u8]) -> anyhow::Result<Profile> {
    read_pprof::parse(raw.to_vec(), &mut Budget::new(MAX_PROFILE_BYTES))
}

pub(super) fn err_of(r: anyhow::Result<Profile>) -> String {
    format!("{:#}", r.expect_err("should fail"))
}

#[test]
fn json_reads_back_what_it_wrote_with_history() {
    let mut p = profile(7, 1000);
    p.snapshots = vec![SnapshotPoint {
        secs: 1.0,
        inuse_bytes: 5,
        inuse_objects: 1,
        alloc_bytes: 9,
        resident_bytes: Some(4096),
    }];
    p.min_age_secs = Some(2.5);
    p.stacks[0].series = vec![100];
    p.stacks[0].growth_bytes_per_sec = Some(12.5);
    p.stacks[0].trend = Some(Trend::Growing);
    p.stacks[1].truncated = true;
    p.notes = vec!["a \u{1b} note".into()];
    p.losses.set(tracer_common::counter::STACK_LOST, 3);
    let back = json(&json_of(&p)).expect("parse");
    assert_eq!(back, p);
}

#[test]
fn json_without_the_newer_fields_still_reads() {
    let p = profile(7, 1000);
    let mut v: serde_json::Value = serde_json::from_slice(&json_of(&p)).expect("json");
    let obj = v.as_object_mut().expect("object");
    obj.remove("snapshots");
    obj.remove("min_age_secs");
    for s in obj["stacks"].as_array_mut().expect("stacks") {
        let s = s.as_object_mut().expect("stack");
        s.remove("series");
        s.remove("growth_bytes_per_sec");
        s.remove("trend");
    }
    let back = json(&serde_json::to_vec(&v).expect("json")).expect("parse");
    assert_eq!(back.stacks, p.stacks);
    assert_eq!(back.totals, p.totals);
}

#[test]
fn malformed_json_and_bad_frame_indices_are_errors() {
    let text = String::from_utf8(json_of(&profile(1, 10))).expect("utf-8");
    let err = err_of(json(&text.as_bytes()[..text.len() / 2]));
    assert!(err.contains("malformed"), "{err}");
    let bad = text.replacen("\"frames\":[0,", "\"frames\":[4000000000,", 1);
    assert_ne!(bad, text, "fixture changed: {text}");
    let err = err_of(json(bad.as_bytes()));
    assert!(
        err.contains("frame index 4000000000 is out of range"),
        "{err}"
    );
}

pub(super) fn gunzip_of(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out).expect("gunzip");
    out
}

#[test]
fn our_pprof_reads_back_with_the_same_numbers_and_frames() {
    let p = profile(42, 1000);
    let mut gz = Vec::new();
    report::write_pprof(&p, View::InuseSpace, &mut gz).expect("render");
    let back = pprof(&gunzip_of(&gz)).expect("parse");
    assert_eq!(back.totals, p.totals);
    let summary = |p: &Profile| -> Vec<(u32, Counts, Vec<String>)> {
        p.stacks
            .iter()
            .map(|s| {
                (
                    s.pid,
                    s.counts,
                    s.frames.iter().map(|f| f.function.clone()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(summary(&back), summary(&p));
    assert_eq!(back.sample_rate, 1);
}

/// A hand-made pprof: `types` sample types, one sample of `values` at a
/// location of function "f" inlined into "g".
pub(super) fn pprof_bytes(types: &[(&str, &str)], values: Vec<i64>) -> Vec<u8> {
    let mut strings = vec![String::new(), "f".into(), "g".into(), "libx.so".into()];
    let mut sample_type = Vec::new();
    for (t, u) in types {
        strings.push((*t).into());
        strings.push((*u).into());
        sample_type.push(proto::ValueType {
            r#type: strings.len() as i64 - 2,
            unit: strings.len() as i64 - 1,
        });
    }
    let pb = proto::Profile {
        sample_type,
        sample: vec![proto::Sample {
            location_id: vec![1],
            value: values,
            label: vec![],
        }],
        mapping: vec![proto::Mapping {
            id: 1,
            filename: 3,
            ..Default::default()
        }],
        location: vec![proto::Location {
            id: 1,
            mapping_id: 1,
            address: 0x1234,
            line: vec![
                proto::Line {
                    function_id: 1,
                    line: 3,
                    ..Default::default()
                },
                proto::Line {
                    function_id: 2,
                    line: 9,
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
        function: vec![
            proto::Function {
                id: 1,
                name: 1,
                ..Default::default()
            },
            proto::Function {
                id: 2,
                name: 2,
                ..Default::default()
            },
        ],
        string_table: strings,
        ..Default::default()
    };
    pb.encode_to_vec()
}

#[test]
fn jemalloc_space_and_objects_map_to_in_use_and_unknown_types_are_noted() {
    let raw = pprof_bytes(
        &[
            ("space", "bytes"),
            ("objects", "count"),
            ("cpu", "nanoseconds"),
        ],
        vec![4096, 2, 77],
    );
    let p = pprof(&raw).expect("parse");
    assert_eq!(
        p.totals,
        Counts {
            inuse_bytes: 4096,
            inuse_objects: 2,
            ..Default::default()
        }
    );
    let names: Vec<(&str, bool)> = p.stacks[0]
        .frames
        .iter()
        .map(|f| (f.function.as_str(), f.inlined))
        .collect();
    assert_eq!(names, [("f", true), ("g", false)]);
    assert_eq!(p.stacks[0].frames[0].module, "libx.so");
    assert!(
        p.notes.iter().any(|n| n.contains("cpu/nanoseconds")),
        "{:?}",
        p.notes
    );
}

#[test]
fn pprof_without_heap_types_or_with_bad_indices_is_an_error() {
    let err = err_of(pprof(&pprof_bytes(&[("cpu", "nanoseconds")], vec![1])));
    assert!(err.contains("cpu/nanoseconds"), "{err}");
    let mut pb = proto::Profile::decode(&pprof_bytes(&[("inuse_space", "bytes")], vec![1])[..])
        .expect("decode");
    pb.function[0].name = 999;
    let err = err_of(pprof(&pb.encode_to_vec()));
    assert!(err.contains("string index 999 is out of range"), "{err}");
    let err = err_of(pprof(&pprof_bytes(&[("inuse_space", "bytes")], vec![1, 2])));
    assert!(err.contains("2 values for 1 sample types"), "{err}");
    let err = err_of(pprof(b"\xff\xff\xff"));
    assert!(err.contains("malformed"), "{err}");
}

#[test]
fn load_names_the_file_and_refuses_truncated_gzip() {
    let dir = std::env::temp_dir().join(format!("memtrace-saved-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let mut gz = Vec::new();
    report::write_pprof(&profile(1, 10), View::InuseSpace, &mut gz).expect("render");
    let path = dir.join("cut.pb.gz");
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&gz[..gz.len() / 2]))
        .expect("write");
    let err = err_of(load(&path));
    assert!(err.contains("cut.pb.gz") && err.contains("gzip"), "{err}");
    let err = err_of(load(&dir.join("missing.json")));
    assert!(
        err.contains("missing.json") && err.contains("cannot open"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn diff_matches_stacks_by_frames_across_processes() {
    let old = profile(10, 1000);
    let new = profile(20, 5000);
    let d = Diff::new(&old, &new, "old.json", "new.json");
    assert_eq!(d.entries.len(), 2, "pids differ, frames match");
    let ranked = d.ranked(View::InuseSpace);
    assert_eq!(ranked.len(), 1, "only the leak changed");
    assert_eq!(d.frames(ranked[0]).collect::<Vec<_>>(), ["leak", "main"]);
    assert_eq!(ranked[0].change(View::InuseSpace), 4000);
    let mut out = Vec::new();
    d.write_collapsed(View::InuseSpace, &mut out)
        .expect("render");
    assert_eq!(String::from_utf8(out).expect("utf-8"), "main;leak 4000\n");
    // Shrinking is negative.
    let back = Diff::new(&new, &old, "new.json", "old.json");
    let mut out = Vec::new();
    back.write_collapsed(View::InuseSpace, &mut out)
        .expect("render");
    assert_eq!(String::from_utf8(out).expect("utf-8"), "main;leak -4000\n");
}

#[test]
fn diff_text_json_and_pprof_carry_the_changes() {
    let d = Diff::new(
        &profile(10, 1000),
        &profile(20, 300),
        "old.json",
        "new.json",
    );
    let mut out = Vec::new();
    d.write_text(View::InuseSpace, 10, &mut out)
        .expect("render");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(
        text.contains("total: old 1500, new 800, change -700"),
        "{text}"
    );
    assert!(
        text.contains("#1 change -700 bytes (old 1000, new 300)"),
        "{text}"
    );
    let mut out = Vec::new();
    d.write_json(View::InuseSpace, &mut out).expect("render");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v["format"], "memtrace-bpf-diff/1");
    assert_eq!(v["stacks"][0]["change"]["inuse_bytes"], -700);
    assert_eq!(v["change"]["alloc_bytes"], -700);
    let mut out = Vec::new();
    d.write_pprof(View::InuseSpace, &mut out).expect("render");
    let pb = proto::Profile::decode(&gunzip_of(&out)[..]).expect("decode");
    assert_eq!(pb.sample.len(), 1);
    assert_eq!(pb.sample[0].value, [-7, -700, -7, -700, 0, 0]);
}

#[test]
fn diff_matches_our_pprof_unknown_frames_with_json_ones() {
    let unknown = Arc::new(Frame {
        function: "[unknown]".into(),
        module: "/lib/libz.so".into(),
        offset: 0x99,
        ..Default::default()
    });
    let mut old = profile(1, 1000);
    let mut frames = old.stacks[0].frames.to_vec();
    frames.insert(0, Arc::clone(&unknown));
    old.stacks[0].frames = frames.into();
    let mut gz = Vec::new();
    report::write_pprof(&old, View::InuseSpace, &mut gz).expect("render");
    let from_pprof = pprof(&gunzip_of(&gz)).expect("parse");
    let d = Diff::new(&old, &from_pprof, "a.json", "a.pb.gz");
    assert!(d.ranked(View::InuseSpace).is_empty(), "{:?}", d.entries);
    assert_eq!(d.frames(&d.entries[0]).next(), Some("[unknown] libz.so"));
}

#[test]
fn sort_growth_needs_history_and_is_the_default_with_it() {
    let mut p = profile(1, 10);
    let err = format!(
        "{:#}",
        sort_stacks(&mut p, Some(Sort::Growth), Path::new("h.json")).expect_err("no history")
    );
    assert!(
        err.contains("h.json") && err.contains("--interval"),
        "{err}"
    );
    let by_inuse = sort_stacks(&mut p, None, Path::new("h.json")).expect("sorted");
    assert_eq!(by_inuse, Sort::Inuse);
    let first = p.stacks[0].frames[0].function.clone();
    let last = p.stacks[p.stacks.len() - 1].frames[0].function.clone();
    p.stacks.last_mut().expect("stacks").growth_bytes_per_sec = Some(5.0);
    assert_eq!(
        sort_stacks(&mut p, None, Path::new("h.json")).expect("sorted"),
        Sort::Growth
    );
    assert_eq!(p.stacks[0].frames[0].function, last);
    sort_stacks(&mut p, Some(Sort::Inuse), Path::new("h.json")).expect("sorted");
    assert_eq!(p.stacks[0].frames[0].function, first);
}

#[test]
fn a_pprof_that_expands_past_the_budget_is_refused_as_it_is_read() {
    let mut pb = proto::Profile::decode(&pprof_bytes(&[("inuse_space", "bytes")], vec![1])[..])
        .expect("decode");
    // 2 lines per location, referenced 51 times: 102 frames.
    pb.sample[0].location_id = vec![1; 51];
    let raw = pb.encode_to_vec();
    let need = |limit: usize| read_pprof::parse(raw.clone(), &mut Budget::new(limit));
    let enough = (1..1 << 20)
        .find(|&limit| need(limit).is_ok())
        .expect("some budget reads it");
    assert_eq!(need(enough).expect("parse").stacks[0].frames.len(), 102);
    // "f" and "libx.so" once more, and the pointer, per frame.
    assert!(enough > 102 * (8 + 1 + 7), "{enough}");
    let err = err_of(need(enough - 1));
    assert!(err.contains("more than 0 MiB of memory"), "{err}");
}

#[test]
fn json_keeps_the_traces_grouping_and_unknown_groupings_are_by_process() {
    let mut p = profile(1, 10);
    p.group_by = crate::profile::GroupBy::Container;
    let back = json(&json_of(&p)).expect("reads");
    assert_eq!(back.group_by, crate::profile::GroupBy::Container);
    let raw = String::from_utf8(json_of(&p)).expect("utf-8");
    let hostile = raw.replace(
        "\"group_by\": \"container\"",
        "\"group_by\": \"\\u001b[2J\"",
    );
    assert_ne!(raw, hostile, "the field is there to replace");
    let back = json(hostile.as_bytes()).expect("reads");
    assert_eq!(back.group_by, crate::profile::GroupBy::Process);
}
