//! `--format pprof` read by its real consumer, `go tool pprof` (Debian's
//! golang-go, installed by `cargo xtask setup`): its `-raw` listing gives
//! each sample's four values, labels and locations, which must hold the
//! target's exact per-site numbers.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use crate::harness::{
    compile_c,
    pprof::pprof,
    rjem::{rjem_binary, EXPECTED_PER_THREAD as RJEM_EXPECTED},
    scratch,
    sites::{EXPECTED_PER_THREAD, FP_FLAGS, O2_FLAGS},
    Target, Tracer,
};

/// Both threads of the sites targets run every site.
const THREADS: u64 = 2;

/// One sample of `go tool pprof -raw`: values in our order [in-use bytes,
/// in-use objects, allocated bytes, allocated objects], the functions of
/// its locations leaf first (inlined ones innermost first), its labels.
#[derive(Debug)]
struct RawSample {
    counts: [u64; 4],
    functions: Vec<String>,
    labels: BTreeMap<String, String>,
}

/// Parses `go tool pprof -raw`: the sample header must be Go's heap
/// profile's, the samples then reference the `Locations` listing.
fn raw_samples(raw: &str) -> Vec<RawSample> {
    let (samples, rest) = raw
        .split_once("\nSamples:\n")
        .and_then(|(_, s)| s.split_once("\nLocations\n"))
        .unwrap_or_else(|| panic!("no Samples / Locations in:\n{raw}"));
    let locations = raw_locations(rest.split("\nMappings\n").next().unwrap_or(rest));
    let mut lines = samples.lines();
    assert_eq!(
        lines.next().map(str::trim),
        Some(
            "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes[dflt] \
             peak_objects/count peak_space/bytes"
        ),
        "sample types of a Go heap profile (then the peak's), in-use space by default:\n{raw}"
    );
    let mut out: Vec<RawSample> = Vec::new();
    for line in lines {
        // A sample line is `VALUES: LOCATION IDS`; label lines follow it.
        let is_sample =
            |v: &str| !v.trim().is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == ' ');
        if let Some((values, ids)) = line.split_once(':').filter(|(v, _)| is_sample(v)) {
            let v: Vec<u64> = values
                .split_whitespace()
                .map(|n| n.parse().expect("sample value"))
                .collect();
            let [alloc_objects, alloc_bytes, inuse_objects, inuse_bytes, _, _] = v[..] else {
                panic!("six values in {line:?}")
            };
            let functions = ids
                .split_whitespace()
                .flat_map(|id| locations.get(id).unwrap_or_else(|| panic!("location {id}")))
                .cloned()
                .collect();
            out.push(RawSample {
                counts: [inuse_bytes, inuse_objects, alloc_bytes, alloc_objects],
                functions,
                labels: BTreeMap::new(),
            });
        } else {
            // `key:[value]` pairs under their sample.
            let sample = out
                .last_mut()
                .unwrap_or_else(|| panic!("labels first: {line}"));
            for pair in line.split("] ").map(str::trim).filter(|p| !p.is_empty()) {
                let (key, value) = pair.split_once(":[").expect("key:[value]");
                sample
                    .labels
                    .insert(key.to_string(), value.trim_end_matches(']').to_string());
            }
        }
    }
    out
}

/// `ID: 0xADDR M=N function file:line s=0`, continued on lines of their own
/// by the functions inlined there: id → function names, innermost first.
fn raw_locations(listing: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in listing.lines() {
        // Name and source: drop ` s=N` and the last word, `file:line`.
        let function = |text: &str| -> String {
            let text = text.rsplit_once(" s=").map_or(text, |(t, _)| t);
            text.rsplit_once(' ').map_or(text, |(f, _)| f).to_string()
        };
        if let Some((id, rest)) = line.split_once(": 0x") {
            current = id.trim().to_string();
            // After the address and `M=N` when it has a mapping.
            let mut words = rest.splitn(2, ' ');
            words.next();
            let rest = words.next().unwrap_or("");
            let rest = match rest.strip_prefix("M=") {
                Some(r) => r.split_once(' ').map_or("", |(_, r)| r),
                None => rest,
            };
            out.entry(current.clone()).or_default().push(function(rest));
        } else if !line.trim().is_empty() {
            out.entry(current.clone())
                .or_default()
                .push(function(line.trim()));
        }
    }
    out
}

/// Sums samples by the first function from the leaf that `key` names.
fn per_site(
    samples: &[RawSample],
    key: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, [u64; 4]> {
    let mut sums: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for s in samples {
        let Some(site) = s.functions.iter().find_map(|f| key(f)) else {
            continue;
        };
        let sum = sums.entry(site).or_default();
        for (total, v) in sum.iter_mut().zip(s.counts) {
            *total += v;
        }
    }
    sums
}

/// The leaf function, as the sites tests key their JSON.
fn leaf(samples: &[RawSample]) -> BTreeMap<String, [u64; 4]> {
    let mut sums: BTreeMap<String, [u64; 4]> = BTreeMap::new();
    for s in samples {
        let sum = sums.entry(s.functions[0].clone()).or_default();
        for (total, v) in sum.iter_mut().zip(s.counts) {
            *total += v;
        }
    }
    sums
}

fn assert_exact(got: &BTreeMap<String, [u64; 4]>, expected: &[(&str, [u64; 4])], what: &str) {
    for (site, per_thread) in expected {
        let want = per_thread.map(|v| v * THREADS);
        assert_eq!(
            got.get(*site),
            Some(&want),
            "{what}, {site}: [inuse bytes, inuse objects, alloc bytes, alloc objects] \
             from go tool pprof differ; all: {got:#?}"
        );
    }
}

/// Traces `targets` (already started) with `scope` args and a pprof
/// report to the scratch file `TAG.pb.gz`, runs their sites, stops the
/// tracer with SIGINT and returns the file.
fn trace_to_pprof(tag: &str, scope: &[&str], targets: &mut [Target]) -> PathBuf {
    let path = scratch(&format!("{tag}.pb.gz"));
    let path_arg = path.to_str().expect("utf-8 scratch path");
    let args = [&["--format", "pprof", "-o", path_arg], scope].concat();
    let tracer = Tracer::start(&args);
    for t in targets.iter_mut() {
        t.run_sites();
    }
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    path
}

/// The sites target built with `cflags`, traced with `extra` args.
fn sites_pprof(tag: &str, cflags: &[&str], extra: &[&str]) -> (Vec<RawSample>, u32) {
    let bin = compile_c("sites", tag, cflags);
    let mut target = [Target::start(&bin, &[])];
    let pid = target[0].pid();
    let pid_arg = pid.to_string();
    let scope = [&["--pid", pid_arg.as_str()], extra].concat();
    let file = trace_to_pprof(&format!("pprof-{tag}"), &scope, &mut target);
    (raw_samples(&pprof(&["-raw"], &file)), pid)
}

/// Every sample carries its process; the sites' stacks reach main.
fn assert_labels_and_stacks(samples: &[RawSample], pid: u32) {
    for s in samples {
        assert_eq!(s.labels.get("pid"), Some(&pid.to_string()), "{s:?}");
        assert!(s.labels.contains_key("comm"), "{s:?}");
    }
    let malloc = samples
        .iter()
        .find(|s| s.functions[0] == "site_malloc")
        .unwrap_or_else(|| panic!("no site_malloc sample: {samples:#?}"));
    assert!(
        malloc.functions.iter().any(|f| f == "main"),
        "complete stack: {malloc:?}"
    );
    assert_eq!(malloc.labels.get("bytes").map(String::as_str), Some("1000"));
}

#[test]
fn go_tool_pprof_reads_exact_site_numbers_of_a_frame_pointer_build() {
    let (samples, pid) = sites_pprof("fp", FP_FLAGS, &["--unwind", "fp"]);
    assert_exact(
        &leaf(&samples),
        EXPECTED_PER_THREAD,
        "fp build, fp unwinding",
    );
    assert_labels_and_stacks(&samples, pid);
}

#[test]
fn go_tool_pprof_reads_exact_site_numbers_without_frame_pointers() {
    let (samples, pid) = sites_pprof("O2", O2_FLAGS, &[]);
    assert_exact(
        &leaf(&samples),
        EXPECTED_PER_THREAD,
        "-O2 build, the default unwinding (tables)",
    );
    assert_labels_and_stacks(&samples, pid);
}

#[test]
fn go_tool_pprof_reads_exact_numbers_of_the_rust_jemalloc_target() {
    let mut target = [Target::start(rjem_binary(), &[])];
    let pid = target[0].pid().to_string();
    let file = trace_to_pprof("pprof-rjem", &["--pid", &pid], &mut target);
    let samples = raw_samples(&pprof(&["-raw"], &file));
    // As rjem.rs keys its JSON: the first `site_*` function from the leaf
    // (allocation shims and inlined std code stand before it).
    let got = per_site(&samples, |f| {
        let name = f.rsplit("::").next().unwrap_or(f);
        name.starts_with("site_").then(|| name.to_string())
    });
    assert_exact(&got, RJEM_EXPECTED, "rjem");
}

#[test]
fn go_tool_pprof_tagfocus_keeps_one_process_of_a_binary_trace() {
    let bin = compile_c("sites", "pprof-binary", O2_FLAGS);
    let mut targets = [Target::start(&bin, &[]), Target::start(&bin, &[])];
    let pids = [targets[0].pid(), targets[1].pid()];
    let bin_arg = bin.to_str().expect("utf-8 path");
    // Two targets' churn at once: the ring buffer must hold the burst
    // (as in scopes.rs).
    let scope = ["--ringbuf-mb", "1024", "--binary", bin_arg];
    let file = trace_to_pprof("pprof-binary", &scope, &mut targets);

    let all = raw_samples(&pprof(&["-raw"], &file));
    let both: Vec<u32> = pids.to_vec();
    for s in &all {
        let pid: u32 = s.labels["pid"].parse().expect("numeric pid label");
        assert!(both.contains(&pid), "{s:?}");
    }
    for pid in pids {
        let focus = format!("pid={pid}");
        let one = raw_samples(&pprof(&["-raw", "-tagfocus", &focus], &file));
        assert!(
            one.iter().all(|s| s.labels["pid"] == pid.to_string()),
            "-tagfocus {focus} kept other processes: {one:#?}"
        );
        assert_exact(&leaf(&one), EXPECTED_PER_THREAD, &focus);
    }
    // And `-top` on one sample type shows the two processes' sum.
    let top = pprof(&["-top", "-sample_index=alloc_objects"], &file);
    let churn = EXPECTED_PER_THREAD
        .iter()
        .find(|(site, _)| *site == "site_churn")
        .map(|(_, v)| v[3] * THREADS * 2)
        .expect("site_churn");
    assert!(
        top.lines()
            .any(|l| l.trim_start().starts_with(&format!("{churn} ")) && l.ends_with("site_churn")),
        "no site_churn line with {churn} objects:\n{top}"
    );
}

#[test]
fn pprof_to_a_terminal_is_refused_with_the_remedy() {
    // A pseudo-terminal as the tracer's stdout, as when a user types the
    // command without -o.
    let (mut leader, mut follower) = (0, 0);
    // SAFETY: openpty writes two descriptors into the integers given; the
    // name, termios and winsize pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned
    // here alone.
    let (leader, follower) = unsafe {
        use std::os::fd::FromRawFd as _;
        (
            std::fs::File::from_raw_fd(leader),
            std::fs::File::from_raw_fd(follower),
        )
    };
    let out = Command::new(crate::harness::TRACER)
        .args(["--format", "pprof", "--pid", "1"])
        .stdout(follower)
        .output()
        .expect("run memtrace-bpf");
    drop(leader);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--format pprof writes gzip-compressed protobuf: add -o FILE.pb.gz"),
        "{stderr}"
    );
}
