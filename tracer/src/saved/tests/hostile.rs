//! Hostile and mistaken inputs: files of another kind are
//! named for what they look like, numbers out of range are refused with
//! their field, and `diff` of profiles at the count limit cannot overflow.

use std::{io::Write as _, path::PathBuf};

use flate2::{write::GzEncoder, Compression};
use prost::Message as _;

use super::{err_of, json, pprof, profile};
use crate::report::{proto, Counts};
use crate::saved::*;

fn sniff_err(bytes: &[u8]) -> String {
    format!("{:#}", input::sniff(bytes).expect_err("not a profile"))
}

fn rendered(render: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    render(&mut out);
    out
}

#[test]
fn sniffing_says_what_a_file_that_is_not_a_profile_looks_like() {
    let p = profile(1, 10);
    let text = rendered(|w| report::write_text(&p, 10, w).expect("text"));
    let err = sniff_err(&text);
    assert!(
        err.contains("a text report of memtrace-bpf") && err.contains("--format json"),
        "{err}"
    );
    let collapsed = rendered(|w| report::write_collapsed(&p, View::InuseSpace, w).expect("c"));
    assert!(sniff_err(&collapsed).contains("collapsed stacks"));
    let svg = rendered(|w| report::write_flamegraph(&p, View::InuseSpace, w).expect("svg"));
    assert!(sniff_err(&svg).contains("SVG"));
    let d = Diff::new(&p, &p, "a", "b");
    let diff = rendered(|w| d.write_text(View::InuseSpace, 10, w).expect("diff"));
    assert!(sniff_err(&diff).contains("output of `memtrace-bpf diff`"));
    assert!(sniff_err(b"").contains("it is empty (0 bytes)"));
    assert!(sniff_err(b" \n\t").contains("only blank space"));
    assert!(sniff_err(b"[1, 2]").contains("a JSON array"));
    let err = sniff_err("hello, wörld\nmore".as_bytes());
    assert!(
        err.contains("it is text") && err.contains("\"hello, wörld\""),
        "{err}"
    );
    assert_eq!(input::sniff(b"  {\"format\"").ok(), Some(input::Kind::Json));
    let pb = rendered(|w| report::write_pprof(&p, View::InuseSpace, w).expect("pprof"));
    let pb = super::tests::gunzip_of(&pb);
    assert_eq!(input::sniff(&pb).ok(), Some(input::Kind::Protobuf));
    // Binary that is not a protobuf: its first bytes, in hex.
    let err = err_of(pprof(b"\x1b[2J\x00\x07garbage"));
    assert!(
        err.contains("neither memtrace-bpf JSON nor a pprof") && err.contains("1b 5b 32 4a"),
        "{err}"
    );
}

fn scratch_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memtrace-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

#[test]
fn json_with_a_byte_order_mark_or_gzipped_reads_and_a_gzipped_text_report_is_named() {
    let p = profile(3, 700);
    let doc = rendered(|w| report::write_json(&p, w).expect("json"));
    let bom = [b"\xef\xbb\xbf".as_slice(), &doc].concat();
    let back = load(&scratch_file("bom.json", &bom)).expect("BOM JSON");
    assert_eq!(back.stacks, p.stacks);
    let back = load(&scratch_file("p.json.gz", &gzip(&doc))).expect("gzip JSON");
    assert_eq!(back.totals, p.totals);
    let text = rendered(|w| report::write_text(&p, 10, w).expect("text"));
    let err = err_of(load(&scratch_file("t.txt.gz", &gzip(&text))));
    assert!(
        err.contains("t.txt.gz") && err.contains("gzip-compressed") && err.contains("text report"),
        "{err}"
    );
    let err = err_of(load(&scratch_file("nothing.gz", &gzip(b""))));
    assert!(err.contains("empty (0 bytes)"), "{err}");
}

/// A saved JSON of `profile(1, 10)` with `edit` applied to its JSON value.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> anyhow::Result<Profile> {
    let doc = rendered(|w| report::write_json(&profile(1, 10), w).expect("json"));
    let mut v: serde_json::Value = serde_json::from_slice(&doc).expect("json");
    edit(&mut v);
    json(&serde_json::to_vec(&v).expect("json")).and_then(|p| limits::check(&p).map(|()| p))
}

type Edit = dyn FnOnce(&mut serde_json::Value);

#[test]
fn the_kernel_s_memory_numbers_out_of_range_are_refused() {
    use serde_json::json as j;
    let cases: Vec<(Box<Edit>, &str)> = vec![
        (
            Box::new(|v| {
                v["processes"] = j!([{"pid": 3, "memory": {"end": {"secs": -1.0}}}]);
            }),
            "process 0 (pid 3): memory: end.secs: -1.0 s is out of range",
        ),
        (
            Box::new(|v| {
                v["cgroup_memory"] = j!({"growth": {"heap_share": 7.5}});
            }),
            "cgroup_memory: growth.heap_share 7.5 is not a share",
        ),
        (
            Box::new(|v| v["snapshots"] = j!([{"secs": 1.0, "resident_bytes": u64::MAX}])),
            "snapshot 0: resident_bytes",
        ),
    ];
    for (edit, says) in cases {
        let err = err_of(edited(edit));
        assert!(err.contains(says), "{says}: {err}");
    }
}

#[test]
fn numbers_out_of_range_are_refused_with_their_field() {
    use serde_json::json as j;
    let max = j!(u64::MAX);
    let cases: Vec<(Box<Edit>, &str)> = vec![
        (
            Box::new(|v| v["min_age_secs"] = j!(-1)),
            "min_age_secs: -1.0 s",
        ),
        (
            Box::new(|v| v["duration_secs"] = j!(1e308)),
            "duration_secs: 1e308 s",
        ),
        (
            Box::new(|v| v["snapshots"] = j!([{"secs": -5}])),
            "snapshot 0: secs",
        ),
        (
            Box::new(|v| v["stacks"][0]["growth_bytes_per_sec"] = j!(1e308)),
            "stack 0: growth",
        ),
        (
            Box::new(move |v| v["totals"]["inuse_bytes"] = max),
            "totals: 18446744073709551615",
        ),
        (
            Box::new(|v| v["stacks"][1]["series"] = j!([u64::MAX])),
            "stack 1: series",
        ),
        (Box::new(|v| v["sample_rate"] = j!(u64::MAX)), "sample rate"),
        (
            Box::new(|v| v["losses"]["stack_lost"] = j!(u64::MAX)),
            "losses",
        ),
        (
            Box::new(|v| {
                v["stacks"][0]["alloc_bytes"] = j!(i64::MAX);
                v["stacks"][1]["alloc_bytes"] = j!(i64::MAX);
            }),
            "the stacks' counts summed",
        ),
        (
            Box::new(|v| v["processes"] = j!([{"pid": 3, "peak": {"secs": -2.0}}])),
            "process 0 (pid 3): peak.secs: -2.0 s is out of range",
        ),
        (
            Box::new(|v| v["processes"] = j!([{"pid": 3, "oom_killed": {"secs": 1e300}}])),
            "process 0 (pid 3): oom_killed.secs: 1e300 s is out of range",
        ),
        (
            Box::new(|v| v["processes"] = j!([{"pid": 3, "container_id": "../../etc\u{1b}[2J"}])),
            "process 0 (pid 3): container_id \"../../etc\u{1b}[2J\" is not a container id",
        ),
        (
            Box::new(|v| v["processes"] = j!([{"pid": 3, "pod_uid": "x".repeat(200)}])),
            "pod_uid \"xxxxxxxxxx",
        ),
        (
            Box::new(|v| v["start_unix_ns"] = j!(u64::MAX)),
            "start_unix_ns: 18446744073709551615",
        ),
    ];
    for (edit, says) in cases {
        let err = err_of(edited(edit));
        assert!(err.contains(says), "{says}: {err}");
    }
    edited(|v| {
        v["stacks"][0]["alloc_bytes"] = j!(i64::MAX);
        v["stacks"][1]["alloc_bytes"] = j!(0);
    })
    .expect("at the limit");
    // What a trace writes is read: a short container id, a pod UID, times
    // within the trace, a folded group's peak without a time.
    edited(|v| {
        v["processes"] = j!([{
            "pid": 3,
            "container_id": "0123456789abcdef",
            "pod_uid": "01234567-89ab-cdef-0123-456789abcdef",
            "peak": {"secs": 0.5, "inuse_bytes": 1, "inuse_objects": 1},
            "oom_killed": {"secs": 2.0, "inuse_bytes": 1, "inuse_objects": 1},
        }, {"pid": 0, "folded": 2, "peak": {"secs": null}}]);
    })
    .expect("a trace's own values");
}

#[test]
fn pprof_values_summing_past_int64_are_refused() {
    let mut pb = proto::Profile::decode(
        &super::tests::pprof_bytes(&[("inuse_space", "bytes")], vec![i64::MAX])[..],
    )
    .expect("decode");
    pb.sample.push(pb.sample[0].clone());
    let p = pprof(&pb.encode_to_vec()).expect("each value fits");
    let err = format!("{:#}", limits::check(&p).expect_err("sum"));
    assert!(err.contains("summed"), "{err}");
}

#[test]
fn diff_of_profiles_at_the_count_limit_does_not_overflow() {
    let mut big = profile(1, 0);
    big.stacks[0].counts = Counts {
        inuse_bytes: MAX_COUNT,
        inuse_objects: MAX_COUNT,
        alloc_bytes: MAX_COUNT,
        alloc_objects: MAX_COUNT,
        ..Counts::default()
    };
    big.stacks.truncate(1);
    big.totals = big.stacks[0].counts;
    limits::check(&big).expect("at the limit");
    let empty = Profile::default();
    for (old, new, change) in [(&empty, &big, i64::MAX), (&big, &empty, -i64::MAX)] {
        let d = Diff::new(old, new, "old", "new");
        assert_eq!(
            d.ranked(View::InuseSpace)[0].change(View::InuseSpace),
            change
        );
        let text = rendered(|w| d.write_text(View::InuseSpace, 5, w).expect("text"));
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains(&format!("change {change:+}")), "{text}");
        rendered(|w| d.write_json(View::AllocSpace, w).expect("json"));
        rendered(|w| d.write_pprof(View::AllocSpace, w).expect("pprof"));
        rendered(|w| d.write_collapsed(View::InuseObjects, w).expect("collapsed"));
        match d.write_flamegraph(View::InuseSpace, &mut Vec::new()) {
            Ok(()) => assert_eq!(change, i64::MAX),
            Err(err) => assert!(format!("{err:#}").contains("NEW (new) has no"), "{err:#}"),
        }
    }
    for view in [View::InuseSpace, View::AllocObjects] {
        rendered(|w| report::write_flamegraph(&big, view, w).expect("flamegraph"));
        rendered(|w| report::write_pprof(&big, view, w).expect("pprof"));
        rendered(|w| report::write_speedscope(&big, view, w).expect("speedscope"));
    }
}

#[test]
fn json_that_would_expand_past_the_budget_is_refused_before_it_is_parsed() {
    // 768 KiB of `{},`: a quarter of a million stacks, ~100 MB of structs.
    let mut doc = br#"{"format":"memtrace-bpf/2","stacks":["#.to_vec();
    doc.extend(b"{},".repeat(1 << 18).iter());
    doc.extend(b"{}]}");
    let err = err_of(read_json::parse(doc.clone(), &mut Budget::new(64 << 20)));
    assert!(err.contains("more than 64 MiB of memory"), "{err}");
    read_json::parse(doc, &mut Budget::new(MAX_PROFILE_BYTES)).expect("fits the default");
    // One long name, referenced 2 bytes at a time: read (4 bytes per
    // reference), but no flamegraph is drawn from the 600 MiB of text it
    // would spell out.
    let mut doc = format!(
        r#"{{"format":"memtrace-bpf/2","frames":[{{"function":"{}"}}],"stacks":[{{"inuse_bytes":1,"frames":[0"#,
        "x".repeat(1 << 20)
    );
    doc.push_str(&",0".repeat(600));
    doc.push_str("]}]}");
    let p = read_json::parse(doc.into_bytes(), &mut Budget::new(256 << 20)).expect("read");
    let bytes = report::folded_text_bytes(&p, View::InuseSpace);
    assert!(bytes > 600 << 20, "{bytes}");
    let err = format!(
        "{:#}",
        limits::check_flamegraph_text(bytes).expect_err("too large")
    );
    assert!(
        err.contains("601 MiB of folded stacks") && err.contains("--format collapsed"),
        "{err}"
    );
}
