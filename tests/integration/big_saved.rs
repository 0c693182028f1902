//! A saved profile as large as real traces write: cc1plus traced in exact
//! mode wrote 73 MB of JSON with 144 k stacks and 7.1 M frame references.
//! `report` (text, collapsed, pprof) and `diff` read it back, within a
//! stated peak RSS (each run's rusage, as GNU time's wait4 gets it).

use std::{
    io::{BufRead, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
};

use memtrace_bpf::report::{proto, Counts, Frame, Profile, StackReport};
use prost::Message as _;

use crate::harness::{offline::open_dir, TRACER};

/// Stacks and frames of the cc1plus trace this reproduces.
const STACKS: usize = 144_000;
const MIN_DEPTH: usize = 30;
const MAX_DEPTH: usize = 70;
const DISTINCT_FRAMES: usize = 30_000;

/// Most a `report` or `diff` of this file may take (peak RSS, MiB; 185
/// measured for report, 289 for diff, which reads two): the profile holds
/// one pointer per reference (55 MiB here) and a few hundred bytes per
/// stack; each renderer adds a 4-byte id per reference. Before, every
/// reference was charged its names (about 130 bytes here) and the file
/// was refused.
const MOST_RSS_MIB: u64 = 450;

/// A C++ compiler's kind of name, unique per index.
fn function_name(i: usize) -> String {
    const PARTS: [&str; 8] = [
        "cp_parser_postfix_expression",
        "tsubst_copy_and_build",
        "instantiate_template_1",
        "cp_build_function_call_vec",
        "finish_call_expr",
        "ggc_internal_cleared_alloc",
        "build_new_method_call",
        "lookup_template_class",
    ];
    format!(
        "{}_{i}(tree_node*, tree_node*, int, tree_node*, bool, vec<tree_node*, va_gc, vl_embed>*)",
        PARTS[i % PARTS.len()]
    )
}

/// xorshift64: a fixed sequence, so the file is the same every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// The cc1plus-shaped profile: one process, stacks leaf first. As a
/// symbolizer makes them, frames come in groups of one return address:
/// the functions inlined there, then the one they were inlined into.
fn cc1plus_profile() -> (Profile, usize) {
    let module = "/usr/lib/gcc/x86_64-linux-gnu/14/cc1plus";
    let build_id: Arc<str> = Arc::from("3c0a6ea59de0b8a7a1b7d1e1c6dfd0b5a2f6e3c4");
    let frame = |i: usize, inlined: bool| {
        Arc::new(Frame {
            function: function_name(i),
            module: module.into(),
            offset: 0x40_0000 + 16 * i as u64,
            file: Some(format!("../../src/gcc/cp/pt{}.cc", i % 40)),
            line: Some(100 + (i % 9000) as u32),
            inlined,
            build_id: Some(Arc::clone(&build_id)),
        })
    };
    // One address in four has a function inlined at it.
    let addresses: Vec<Vec<Arc<Frame>>> = (0..DISTINCT_FRAMES)
        .map(|i| match i % 4 {
            0 => vec![frame(i + DISTINCT_FRAMES, true), frame(i, false)],
            _ => vec![frame(i, false)],
        })
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15;
    let mut references = 0;
    let mut stacks = Vec::with_capacity(STACKS);
    for i in 0..STACKS {
        let depth = MIN_DEPTH + (next(&mut state) as usize) % (MAX_DEPTH - MIN_DEPTH);
        let mut frames: Vec<Arc<Frame>> = Vec::with_capacity(depth + 1);
        while frames.len() < depth {
            let at = &addresses[next(&mut state) as usize % DISTINCT_FRAMES];
            frames.extend(at.iter().cloned());
        }
        references += frames.len();
        let bytes = 16 + (i as u64 % 4096);
        stacks.push(StackReport {
            pid: 4242,
            start_time: Some(123_456),
            counts: Counts {
                inuse_bytes: bytes,
                inuse_objects: 1,
                alloc_bytes: 3 * bytes,
                alloc_objects: 3,
                peak_inuse_bytes: 2 * bytes,
                peak_inuse_objects: 2,
            },
            frames: frames.into(),
            ..StackReport::default()
        });
    }
    let mut totals = Counts::default();
    for s in &stacks {
        totals.inuse_bytes += s.counts.inuse_bytes;
        totals.inuse_objects += s.counts.inuse_objects;
        totals.alloc_bytes += s.counts.alloc_bytes;
        totals.alloc_objects += s.counts.alloc_objects;
    }
    let profile = Profile {
        target: "cc1plus".into(),
        duration_secs: 12.0,
        end_reason: "target exited".into(),
        sample_rate: 1,
        unwind: "tables".into(),
        totals,
        stacks,
        ..Profile::default()
    };
    (profile, references)
}

/// Runs memtrace-bpf ARGS under GNU time: exit success, stderr, the
/// child's peak RSS in MiB (time's wait4 of it: a child spawned from this
/// process would count this process's own memory, which other tests
/// running alongside make large), and `read(stdout)`, which reads it as
/// it comes.
fn run_measured<T>(
    dir: &Path,
    args: &[&str],
    read: impl FnOnce(&mut dyn BufRead) -> T,
) -> (bool, String, u64, T) {
    let (err_path, rss_path) = (dir.join("stderr"), dir.join("maxrss"));
    let mut child = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&rss_path)
        .arg(TRACER)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .stdin(Stdio::null())
        .spawn()
        .expect("run /usr/bin/time (Debian package time)");
    let stdout = child.stdout.take().expect("stdout");
    let got = read(&mut BufReader::with_capacity(1 << 20, stdout));
    let status = child.wait().expect("wait");
    let stderr = std::fs::read_to_string(&err_path).expect("stderr");
    let rss = std::fs::read_to_string(&rss_path).expect("time's output");
    let kb: u64 = rss
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS from /usr/bin/time in {rss}"));
    (status.success(), stderr, kb >> 10, got)
}

/// Lines of `out`, and whether one of them holds `needle`.
fn count_lines(out: &mut dyn BufRead, needle: &str) -> (usize, bool) {
    let (mut lines, mut found) = (0, false);
    let mut line = Vec::new();
    while out.read_until(b'\n', &mut line).expect("read stdout") > 0 {
        lines += 1;
        found |= !found && String::from_utf8_lossy(&line).contains(needle);
        line.clear();
    }
    (lines, found)
}

fn read_all(out: &mut dyn BufRead) -> Vec<u8> {
    let mut all = Vec::new();
    out.read_to_end(&mut all).expect("read stdout");
    all
}

#[test]
fn report_and_diff_read_a_profile_as_large_as_a_trace_of_cc1plus_writes() {
    let dir = open_dir("big-saved");
    let (profile, references) = cc1plus_profile();
    assert!(references >= 7_000_000, "{references} references");
    let path: PathBuf = dir.join("cc1plus.json");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
    memtrace_bpf::report::write_json(&profile, &mut file).expect("write the JSON");
    drop(file);
    let size = std::fs::metadata(&path).expect("stat").len();
    assert!(size > 73_000_000, "{size} bytes");
    let leaf = memtrace_bpf::report::folded_name(&profile.stacks[0].frames[0].function);
    drop(profile);
    let file = path.to_str().expect("utf-8 path");
    let measure = |name: &str, rss: u64, ok: bool, stderr: &str| {
        assert!(ok, "{name}: {stderr}");
        eprintln!("{name}: peak RSS {rss} MiB");
        assert!(
            rss <= MOST_RSS_MIB,
            "{name}: peak RSS {rss} MiB, more than {MOST_RSS_MIB} MiB"
        );
    };
    let (ok, err, rss, text) = run_measured(&dir, &["report", file], read_all);
    measure("text", rss, ok, &err);
    let text = String::from_utf8_lossy(&text);
    let hidden = format!("{} more stacks not shown", STACKS - 10);
    assert!(text.contains(&hidden), "{text}");
    let args = ["report", "-f", "collapsed", file];
    let (ok, err, rss, (lines, found)) = run_measured(&dir, &args, |o| count_lines(o, &leaf));
    measure("collapsed", rss, ok, &err);
    assert_eq!(lines, STACKS);
    assert!(found, "no line holds {leaf}");
    let args = ["report", "-f", "pprof", file];
    let (ok, err, rss, pprof) = run_measured(&dir, &args, read_all);
    measure("pprof", rss, ok, &err);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&pprof[..])
        .read_to_end(&mut raw)
        .expect("gzip");
    let samples = proto::Profile::decode(&raw[..])
        .expect("pprof")
        .sample
        .len();
    assert_eq!(samples, STACKS);
    let (ok, err, rss, diff) = run_measured(&dir, &["diff", file, file], read_all);
    measure("diff", rss, ok, &err);
    let diff = String::from_utf8_lossy(&diff);
    assert!(diff.contains("0 stacks changed"), "{diff}");
}
