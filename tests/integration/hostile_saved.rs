//! Hostile and mistaken saved files, read by `report` as
//! `nobody`: refused within bounded memory (peak RSS measured with
//! /usr/bin/time), numbers out of range refused, and files of another kind
//! named for what they look like.

use std::{ffi::OsStr, io::Write as _, path::Path, process::Command};

use flate2::{write::GzEncoder, Compression};
use memtrace_bpf::report::proto;
use prost::Message as _;

use crate::harness::{
    offline::{as_nobody, open_dir},
    TRACER,
};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

/// `memtrace-bpf report FILE` as nobody: (exit code, stderr, peak RSS in MiB).
fn report(file: &Path) -> (Option<i32>, String, u64) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["/usr/bin/time", "-f", "maxrss_kb=%M", TRACER, "report"])
        .arg(file)
        .output()
        .expect("run setpriv and /usr/bin/time (Debian packages util-linux, time)");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let rss = err
        .rsplit_once("maxrss_kb=")
        .and_then(|(_, kb)| kb.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no maxrss from /usr/bin/time in {err}"));
    assert!(!err.contains("panicked"), "{err}");
    (out.status.code(), err, rss >> 10)
}

/// A pprof of one location with `lines` lines of function "f" (name
/// `name`), referenced `refs` times by each of `samples` samples.
fn repeating_pprof(name: &str, lines: usize, refs: usize, samples: usize) -> Vec<u8> {
    let sample = proto::Sample {
        location_id: vec![1; refs],
        value: vec![1],
        label: vec![],
    };
    let pb = proto::Profile {
        sample_type: vec![proto::ValueType { r#type: 1, unit: 2 }],
        sample: vec![sample; samples],
        location: vec![proto::Location {
            id: 1,
            line: vec![
                proto::Line {
                    function_id: 1,
                    ..Default::default()
                };
                lines
            ],
            ..Default::default()
        }],
        function: vec![proto::Function {
            id: 1,
            name: 3,
            ..Default::default()
        }],
        string_table: vec![
            String::new(),
            "inuse_space".into(),
            "bytes".into(),
            name.into(),
        ],
        ..Default::default()
    };
    gzip(&pb.encode_to_vec())
}

#[test]
fn hostile_saved_files_are_refused_within_bounded_memory_as_nobody() {
    let dir = open_dir("hostile-saved");
    // (file, bytes, what the error says, most MiB it may take).
    let cases: [(&str, Vec<u8>, &str, u64); 4] = [
        // 256 MiB of zeros in 256 KB: refused at 128 MiB (1 GiB before).
        (
            "bomb.json.gz",
            gzip(&vec![0; 256 << 20]),
            "decompresses to more than 128 MiB",
            200,
        ),
        // 2^26 frames from 167 bytes: accepted before, at 536 MB.
        (
            "expand.pb.gz",
            repeating_pprof("f", 4096, 1024, 16),
            "512 MiB of memory",
            600,
        ),
        // A 1 MiB name copied into 2000 lines: 2 GB before.
        (
            "long-name.pb.gz",
            repeating_pprof(&"n".repeat(1 << 20), 2000, 1, 1),
            "512 MiB",
            600,
        ),
        // 20 M empty samples in 40 KB: 1.5 GB before.
        (
            "empty-samples.pb.gz",
            gzip(
                &proto::Profile {
                    sample: vec![proto::Sample::default(); 20 << 20],
                    ..Default::default()
                }
                .encode_to_vec(),
            ),
            "512 MiB of memory",
            200,
        ),
    ];
    for (name, bytes, says, most) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        let (code, err, rss) = report(&path);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
        assert!(
            rss <= most,
            "{name}: peak RSS {rss} MiB, more than {most} MiB: {err}"
        );
    }
}

#[test]
fn saved_files_of_other_kinds_are_named_or_read_as_nobody() {
    let dir = open_dir("hostile-kinds");
    let good = br#"{"format":"memtrace-bpf/2","target":"t","totals":{"inuse_bytes":5},
        "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
        "frames":[{"function":"leaky","module":"/bin/x"}]}"#;
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    let text = as_nobody(&[OsStr::new("report"), write("good.json", good).as_os_str()]);
    assert!(text.status.success(), "{text:?}");
    // A JSON with a byte-order mark, and gzip-compressed JSON, are read.
    for (name, bytes) in [
        ("bom.json", [b"\xef\xbb\xbf".as_slice(), good].concat()),
        ("good.json.gz", gzip(good)),
    ] {
        let out = as_nobody(&[OsStr::new("report"), write(name, &bytes).as_os_str()]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("leaky"),
            "{name}: {out:?}"
        );
    }
    let min_age =
        String::from_utf8_lossy(good).replace("\"target\"", "\"min_age_secs\":-1,\"target\"");
    // A process entry put into `good`.
    let with_process = |process: &str| {
        String::from_utf8_lossy(good)
            .replace(
                "\"target\"",
                &format!("\"processes\":[{process}],\"target\""),
            )
            .into_bytes()
    };
    let cases: [(&str, Vec<u8>, &str); 8] = [
        (
            "report.txt",
            text.stdout.clone(),
            "a text report of memtrace-bpf",
        ),
        (
            "report.txt.gz",
            gzip(&text.stdout),
            "gzip-compressed: it is a text report",
        ),
        ("empty.json", Vec::new(), "it is empty (0 bytes)"),
        (
            "binary.bin",
            b"\x1b[2J\x00\x07".to_vec(),
            "starts with the bytes 1b 5b 32 4a 00 07",
        ),
        (
            "age.json",
            min_age.into_bytes(),
            "min_age_secs: -1.0 s is out of range",
        ),
        (
            "peak.json",
            with_process(r#"{"pid":1,"peak":{"secs":-3,"inuse_bytes":5,"inuse_objects":1}}"#),
            "process 0 (pid 1): peak.secs: -3.0 s is out of range",
        ),
        (
            "oom.json",
            with_process(r#"{"pid":1,"oom_killed":{"secs":1e300,"inuse_bytes":5}}"#),
            "process 0 (pid 1): oom_killed.secs: 1e300 s is out of range",
        ),
        (
            "container.json",
            with_process(r#"{"pid":1,"container_id":"not-hex\u001b[2J"}"#),
            "process 0 (pid 1): container_id \"not-hex\\x1b[2J\" is not a container id",
        ),
    ];
    for (name, bytes, says) in cases {
        let out = as_nobody(&[OsStr::new("report"), write(name, &bytes).as_os_str()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains(name) && err.contains(says), "{name}: {err}");
        assert!(
            !err.contains("malformed protobuf") && !err.contains('\u{1b}'),
            "{name}: {err}"
        );
    }
}
