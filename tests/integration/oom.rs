//! OOM kills: a followed child joins a memory cgroup with a small limit,
//! allocates known sites, then grows until the OOM killer kills it. The
//! report names the kill, with its time and its heap then, and keeps that
//! heap in use (not "not freed at exit" as for an ordinary exit).

use std::{path::Path, process::Command};

use crate::forks::only_pid;
use crate::harness::{
    cgroup::MemoryCgroup,
    compile_c,
    sites::{assert_no_losses, per_site, O0_FLAGS},
    JsonTracer, TRACER,
};

/// Bytes the child may use: a few dozen of its 1 MiB blocks.
const LIMIT: u64 = 32 << 20;
const BLOCK: u64 = 1 << 20;

#[test]
fn an_oom_killed_child_keeps_its_heap_at_the_kill_in_use() {
    let bin = compile_c("oom_victim", "oom", O0_FLAGS);
    let cgroup = MemoryCgroup::new("oom", LIMIT);
    let procs = cgroup.procs();
    let args = [
        "--follow-forks".as_ref(),
        "--".as_ref(),
        bin.as_os_str(),
        procs.as_os_str(),
    ];
    let tracer = JsonTracer::spawn("oom-victim", &args);
    let (finished, path) = tracer.finish_unchecked();
    assert!(finished.status.success(), "{}", finished.stderr);
    let report = crate::harness::read_json(&path);
    let out = &finished.stdout;
    assert!(
        out.contains("child killed by signal 9"),
        "the child was not OOM-killed: {out}"
    );
    let (child, grew) = child_and_blocks_grown(out);
    assert_no_losses(&report);
    assert_eq!(report["oom_kills"], 1, "{}", report["processes"]);

    // Its sites, exactly; its growth, block for block.
    let sites = per_site(&only_pid(&report, child));
    assert_eq!(
        sites.get("keep_small"),
        Some(&[3000, 3, 3000, 3]),
        "{sites:?}"
    );
    assert_eq!(
        sites.get("keep_large"),
        Some(&[5000, 1, 5000, 1]),
        "{sites:?}"
    );
    let grow = sites.get("grow_block").expect("grow_block site");
    assert!(
        grow[1] == grew || grow[1] == grew + 1,
        "{grow:?} after {grew} blocks"
    );
    assert_eq!(grow[0], grow[1] * BLOCK, "{grow:?}");
    assert_eq!(grow[0..2], grow[2..4], "nothing of it freed: {grow:?}");

    // Its entry names the kill, and its heap then is all it allocated.
    let entry = crate::harness::process_entry(&report, child);
    let kill = &entry["oom_killed"];
    let secs = kill["secs"].as_f64().expect("oom_killed.secs");
    let duration = report["duration_secs"].as_f64().expect("duration");
    assert!(secs > 0.0 && secs <= duration, "{kill} in {duration} s");
    let child_inuse: u64 = sites.values().map(|s| s[0]).sum();
    let child_objects: u64 = sites.values().map(|s| s[1]).sum();
    assert_eq!(kill["inuse_bytes"], child_inuse, "{entry}");
    assert_eq!(kill["inuse_objects"], child_objects, "{entry}");
    assert_eq!(entry["exited"], true);
    // Not folded away as an ordinary exit.
    assert_eq!(report["not_freed_at_exit"]["bytes"], 0);
    let inuse = report["totals"]["inuse_bytes"].as_u64().expect("in use");
    assert!(inuse >= child_inuse, "{}", report["totals"]);

    // The text report (read back from the JSON) says so.
    assert_the_text_report_names_the_kill(&path, child, secs, child_inuse, child_objects);
    drop(cgroup);
}

/// The child's pid and how many blocks it grew by, from the program's
/// output.
fn child_and_blocks_grown(out: &str) -> (u64, u64) {
    let child: u64 = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("child ")?
                .strip_suffix(" kept")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no child pid in {out}"));
    // Blocks allocated and touched; one more may have been allocated and
    // been being touched when the kill came.
    let grew: u64 = out
        .lines()
        .filter_map(|l| l.strip_prefix("grew ")?.parse().ok())
        .max()
        .unwrap_or(0);
    (child, grew)
}

/// `memtrace-bpf report` of the saved JSON shows the kill on the child's
/// line, with its time and heap then, and counts it.
fn assert_the_text_report_names_the_kill(
    path: &Path,
    child: u64,
    secs: f64,
    child_inuse: u64,
    child_objects: u64,
) {
    let text = Command::new(TRACER)
        .arg("report")
        .arg(path)
        .output()
        .expect("run memtrace-bpf report");
    let text = String::from_utf8_lossy(&text.stdout);
    let line = format!("{child}  ");
    let victim = text
        .lines()
        .find(|l| l.trim_start().starts_with(&line))
        .unwrap_or_else(|| panic!("no line for pid {child}:\n{text}"));
    assert!(
        victim.contains(&format!(
            "(killed by the OOM killer at {secs:.1} s, holding {child_inuse} bytes in {child_objects} objects)"
        )),
        "{victim}"
    );
    assert!(text.contains("OOM kills:  1 process"), "{text}");
}
