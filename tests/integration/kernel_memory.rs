//! The kernel's memory numbers beside the heap: a process whose memory
//! grows through mmap gets a report saying the heap explains almost none
//! of the growth, one that leaks through malloc a report saying the heap
//! explains it, with the resident bytes in the history; a cgroup's numbers
//! come from its memory controller (v1 on this host, beside the cgroup v2
//! traced; v2 in a guest of the kernel matrix).

use std::process::Command;

use serde_json::Value;

use crate::harness::{
    cgroup::{MemoryCgroup, V2Cgroup},
    compile_c,
    sites::FP_FLAGS,
    JsonTracer, Target, TRACER,
};

const MIB: f64 = 1_048_576.0;
/// rss_growth.c maps or leaks 20 MiB/s by its own clock: a 4-second trace
/// sees about 80 MiB; a busy host delays the first reading or the last.
const MIN_GROWTH: f64 = 20.0 * MIB;

fn growth(memory: &Value) -> (f64, f64, Option<f64>, f64) {
    let g = &memory["growth"];
    let num = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("{k} in {memory}"));
    (
        num("anon_growth_bytes"),
        num("heap_growth_bytes"),
        g["heap_share"].as_f64(),
        num("other_anon_bytes"),
    )
}

/// The text report of a saved JSON report.
fn text_of(report: &Value) -> String {
    let path = crate::harness::scratch("kernel-memory-report.json");
    std::fs::write(&path, report.to_string()).expect("write the report");
    let out = Command::new(TRACER)
        .arg("report")
        .arg(&path)
        .output()
        .expect("run report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 text")
}

#[test]
fn memory_grown_through_mmap_is_said_not_to_be_the_heap() {
    let bin = compile_c("rss_growth", "rss-mmap", FP_FLAGS);
    let target = Target::start(&bin, &["mmap", "60"]);
    let pid = target.pid();
    let args = ["--pid", &pid.to_string(), "--interval", "0.5", "-d", "4"];
    let (report, _) = JsonTracer::start_sampling("rss-mmap", &args).finish();
    drop(target);
    let entry = crate::harness::process_entry(&report, pid);
    let memory = &entry["memory"];
    assert_eq!(memory["source"], "status", "{entry}");
    let (anon, heap, share, other) = growth(memory);
    assert!(anon >= MIN_GROWTH, "{memory}");
    assert!(heap < MIB, "the heap did not grow: {memory}");
    assert!(share.is_some_and(|s| s < 0.05), "{memory}");
    assert!(other >= 0.9 * anon, "{memory}");
    let (start, end) = (&memory["start"], &memory["end"]);
    assert!(start["secs"].as_f64() < Some(0.5), "{memory}");
    let resident = |r: &Value| r["resident_bytes"].as_f64().expect("resident_bytes");
    assert!(resident(end) >= resident(start) + MIN_GROWTH, "{memory}");
    assert_eq!(
        memory["peak"]["resident_bytes"], memory["end"]["resident_bytes"],
        "grows to the end: {memory}"
    );

    // The history carries the resident bytes, rising with the mappings.
    let points = report["snapshots"].as_array().expect("snapshots");
    let resident: Vec<f64> = points
        .iter()
        .filter_map(|p| p["resident_bytes"].as_f64())
        .collect();
    assert!(
        resident.len() + 1 >= points.len() && resident.len() >= 6,
        "{points:?}"
    );
    assert!(
        resident.last() >= Some(&(resident[0] + MIN_GROWTH / 2.0)),
        "{resident:?}"
    );

    let text = text_of(&report);
    assert!(text.contains("Memory the kernel counted"), "{text}");
    assert!(
        text.contains("the heap explains little of the growth"),
        "{text}"
    );
    assert!(
        text.contains("is anonymous memory the hooked allocator did not hand out"),
        "{text}"
    );
    assert!(text.contains(&format!("/proc/{pid}/smaps")), "{text}");
}

#[test]
fn a_malloc_leak_is_explained_by_the_heap() {
    let bin = compile_c("rss_growth", "rss-malloc", FP_FLAGS);
    let target = Target::start(&bin, &["malloc", "60"]);
    let pid = target.pid();
    let args = ["--pid", &pid.to_string(), "-d", "4"];
    let (report, _) = JsonTracer::start("rss-malloc", &args).finish();
    drop(target);
    let memory = &crate::harness::process_entry(&report, pid)["memory"];
    let (anon, heap, share, other) = growth(memory);
    assert!(anon >= MIN_GROWTH, "{memory}");
    // A block allocated between the last reading and the end, or written
    // after it, is heap the kernel has not counted yet: within two blocks.
    assert!(heap >= 0.9 * anon && heap <= anon + 2.0 * MIB, "{memory}");
    assert!(share.is_some_and(|s| s >= 0.9), "{memory}");
    assert!(other <= 0.1 * anon, "{memory}");
    let text = text_of(&report);
    assert!(text.contains("the heap explains the growth"), "{text}");
    assert!(!text.contains("did not hand out"), "{text}");
}

/// A cgroup's numbers: the v2 cgroup traced and, where the memory
/// controller is on v1 (this host), the v1 memory cgroup at the same path,
/// as systemd makes them on hybrid hosts.
#[test]
fn a_cgroup_s_memory_comes_from_its_memory_controller() {
    let bin = compile_c("rss_growth", "rss-cgroup", FP_FLAGS);
    let traced = V2Cgroup::new("rss-cgroup");
    let memory_cgroup = (!MemoryCgroup::is_v2()).then(|| MemoryCgroup::new("rss-cgroup", 1 << 30));
    let target = Target::start(&bin, &["mmap", "60"]);
    traced.add(target.pid());
    if let Some(m) = &memory_cgroup {
        std::fs::write(m.procs(), target.pid().to_string()).expect("join the v1 memory cgroup");
    }
    let args = ["--cgroup", &traced.path(), "-d", "4"];
    let (report, _) = JsonTracer::start_sampling("rss-cgroup", &args).finish();
    drop(target);
    let memory = &report["cgroup_memory"];
    let version = if memory_cgroup.is_some() {
        "cgroup v1"
    } else {
        "cgroup v2"
    };
    assert_eq!(memory["source"], version, "{report}");
    let (anon, _, share, other) = growth(memory);
    assert!(anon >= MIN_GROWTH, "{memory}");
    assert!(share.is_some_and(|s| s < 0.05), "{memory}");
    assert!(other >= 0.9 * anon, "{memory}");
    let text = text_of(&report);
    assert!(text.contains(&format!("the cgroup ({version})")), "{text}");
    drop(memory_cgroup);
}
