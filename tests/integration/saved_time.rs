//! When a profile says it was taken: the trace's wall-clock start, kept in
//! the JSON (`start_unix_ns`) and given as pprof's `time_nanos`, by the
//! trace itself and by `report` of its saved file later; a saved file
//! that does not say (written before it was kept) is still read, and its
//! pprof says "unknown" (0) rather than the time it was rendered.

use std::{
    io::Read as _,
    path::Path,
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use flate2::read::GzDecoder;
use memtrace_bpf::report::proto;
use prost::Message as _;

use crate::harness::{
    compile_c, scratch,
    sites::{assert_sites_exact, O0_FLAGS},
    JsonTracer, Target, Tracer, TRACER,
};

fn unix_ns(t: SystemTime) -> i64 {
    let ns = t.duration_since(UNIX_EPOCH).expect("after 1970").as_nanos();
    i64::try_from(ns).expect("fits")
}

fn decoded(path: &Path) -> proto::Profile {
    let mut raw = Vec::new();
    GzDecoder::new(std::fs::File::open(path).expect("open the pprof"))
        .read_to_end(&mut raw)
        .expect("gunzip the pprof");
    proto::Profile::decode(&raw[..]).expect("decode the pprof")
}

/// `memtrace-bpf report SAVED -f pprof` into a scratch file, decoded.
fn report_pprof(saved: &Path, tag: &str) -> proto::Profile {
    let out_path = scratch(&format!("{tag}.pb.gz"));
    let out = Command::new(TRACER)
        .arg("report")
        .arg(saved)
        .args(["-f", "pprof", "-o"])
        .arg(&out_path)
        .output()
        .expect("run memtrace-bpf report");
    assert!(out.status.success(), "{out:?}");
    decoded(&out_path)
}

#[test]
fn pprof_and_json_keep_the_traces_start() {
    let bin = compile_c("sites", "saved-time", O0_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let before = unix_ns(SystemTime::now());
    let tracer = JsonTracer::start("saved-time", &["--pid", pid.as_str()]);
    target.run_sites();
    let (report, _) = tracer.stop();
    let stopped = unix_ns(SystemTime::now());
    assert_sites_exact(&report);
    let start = report["start_unix_ns"]
        .as_i64()
        .unwrap_or_else(|| panic!("start_unix_ns: {}", report["start_unix_ns"]));
    assert!(
        (before..=stopped).contains(&start),
        "the start lies between the tracer's launch and its exit: \
         {before} <= {start} <= {stopped}"
    );
    // Rendered later, the saved file keeps the trace's start.
    std::thread::sleep(Duration::from_secs(1));
    let pb = report_pprof(&scratch("saved-time.json"), "saved-time-report");
    assert_eq!(pb.time_nanos, start);
    let secs = report["duration_secs"].as_f64().expect("duration");
    assert_eq!(pb.duration_nanos, (secs * 1e9) as i64);

    // The trace's own pprof says the same moment.
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let path = scratch("saved-time-live.pb.gz");
    let before = unix_ns(SystemTime::now());
    let tracer = Tracer::start(&[
        "--pid",
        pid.as_str(),
        "--format",
        "pprof",
        "-o",
        path.to_str().expect("utf-8"),
    ]);
    target.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    let stopped = unix_ns(SystemTime::now());
    assert!(out.status.success(), "{}", out.stderr);
    let pb = decoded(&path);
    // Its start, not the time it was written: before the end by the
    // trace's duration.
    assert!(
        (before..=stopped - pb.duration_nanos).contains(&pb.time_nanos),
        "{before} <= {} <= {stopped} - {}",
        pb.time_nanos,
        pb.duration_nanos
    );
}

#[test]
fn a_saved_file_without_its_start_is_read_and_says_unknown() {
    let old = br#"{"format":"memtrace-bpf/2","target":"t","duration_secs":2.5,
        "totals":{"inuse_bytes":5},
        "stacks":[{"pid":1,"inuse_bytes":5,"inuse_objects":1,"frames":[0]}],
        "frames":[{"function":"leaky","module":"/bin/x"}]}"#;
    let saved = scratch("saved-time-old.json");
    std::fs::write(&saved, old).expect("write");
    let pb = report_pprof(&saved, "saved-time-old");
    assert_eq!(
        pb.time_nanos, 0,
        "pprof's unknown, not the time of `report`"
    );
    assert_eq!(pb.duration_nanos, 2_500_000_000);
    assert_eq!(pb.sample.len(), 1);
}
