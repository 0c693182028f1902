//! `--cgroup` followed by its process list, as on kernels whose verifier
//! does not offer uprobe programs the calling task's cgroup ancestry
//! (Debian's 5.10). MEMTRACE_BPF_TEST_CGROUP_BY_PROCESSES=1 makes the
//! tracer act so on this machine's kernel, which has the helper.

use std::collections::BTreeMap;

use crate::{
    cgroups::{assert_process_exact, restarted_service_traced_again, sites_copy},
    forks::only_pid,
    harness::{cgroup::V2Cgroup, compile_c, sites::per_site, sites::O2_FLAGS, JsonTracer, Target},
};

/// Several targets run their 20000-allocation churn at once into one
/// tracer (as in cgroups.rs).
const RINGBUF_MB: &str = "1024";

/// Processes in the subtree at the start (in the cgroup and below it),
/// one moved in during the trace, one moved out, one outside, and a
/// forker whose children, forked during the trace, allocate at once: each
/// traced one exact, the others absent.
#[test]
fn a_cgroup_followed_by_its_process_list_traces_exactly_its_processes() {
    let top = V2Cgroup::new("by-pids");
    let traced = top.child("traced");
    let below = traced.child("below");
    let other = top.child("other");
    let bin = sites_copy("cgroup-by-pids", "memtrace_cgbp");
    let mut in_traced = Target::start(&bin, &[]);
    traced.add(in_traced.pid());
    let mut in_below = Target::start(&bin, &[]);
    below.add(in_below.pid());
    let mut outside = Target::start(&bin, &[]);
    other.add(outside.pid());
    let mut moved_in = Target::start(&bin, &[]);
    let mut moved_out = Target::start(&bin, &[]);
    traced.add(moved_out.pid());
    let forker_bin = compile_c("forker", "cgroup-by-pids", O2_FLAGS);
    let mut forker = Target::start(&forker_bin, &["2"]);
    traced.add(forker.pid());
    let mut tracer = JsonTracer::start_with_env(
        "cgroup-by-pids",
        &[
            "--ringbuf-mb",
            RINGBUF_MB,
            "--verbose",
            "--cgroup",
            &traced.path(),
        ],
        &[("MEMTRACE_BPF_TEST_CGROUP_BY_PROCESSES", "1")],
    );
    // The tracer says when it took each move (--verbose): it hooks a
    // process moved in once it is in the filter, and says one moved out
    // left it. The processes allocate only after that ("go").
    traced.add(moved_in.pid());
    tracer.stderr.wait_for(
        &format!("pid {} uses ", moved_in.pid()),
        "the process moved in found",
    );
    other.add(moved_out.pid());
    tracer.stderr.wait_for(
        &format!("pid {} left the cgroup", moved_out.pid()),
        "the process moved out left the filter",
    );
    for t in [
        &mut in_traced,
        &mut in_below,
        &mut outside,
        &mut moved_in,
        &mut moved_out,
    ] {
        t.run_sites();
    }
    forker.send("go");
    forker.wait_for("forked all");
    let (report, finished) = tracer.stop();

    assert_eq!(report["target"], format!("cgroup {}", traced.path()));
    assert!(
        finished.stderr.contains(&format!(
            "tracing every process in the cgroup {} and below it, followed by its process list",
            traced.path()
        )),
        "{}",
        finished.stderr
    );
    let notes = report["notes"].to_string();
    let said = format!(
        "the cgroup {} was followed by its process list",
        traced.path()
    );
    assert!(notes.contains(&said), "{notes}");
    for pid in [in_traced.pid(), in_below.pid(), moved_in.pid()] {
        assert_process_exact(&report, pid);
    }
    for pid in [outside.pid(), moved_out.pid()] {
        let stacks = only_pid(&report, u64::from(pid));
        assert_eq!(stacks["stacks"], serde_json::json!([]), "pid {pid}");
    }
    // forker.c: the parent keeps 5 blocks of 2000 bytes and its thread 2
    // of 3000; child k, followed in the kernel from its fork, k blocks of
    // k * 1000 bytes, under its own pid.
    let parent = per_site(&only_pid(&report, u64::from(forker.pid())));
    assert_eq!(parent.get("parent_site"), Some(&[10_000, 5, 10_000, 5]));
    assert_eq!(parent.get("thread_site"), Some(&[6_000, 2, 6_000, 2]));
    let children: BTreeMap<u64, [u64; 4]> = crate::harness::pids(&report)
        .into_iter()
        .filter_map(|pid| Some((pid, *per_site(&only_pid(&report, pid)).get("child_site")?)))
        .collect();
    let mut sizes: Vec<[u64; 4]> = children.values().copied().collect();
    sizes.sort_unstable();
    assert_eq!(
        sizes,
        [[1000, 1, 1000, 1], [4000, 2, 4000, 2]],
        "{children:?}"
    );
    let mut traced_pids: Vec<u64> = [in_traced.pid(), in_below.pid(), moved_in.pid()]
        .into_iter()
        .chain([forker.pid()])
        .map(u64::from)
        .collect();
    traced_pids.extend(children.keys());
    for stack in report["stacks"].as_array().expect("stacks") {
        let pid = stack["pid"].as_u64();
        assert!(
            pid.is_some_and(|p| traced_pids.contains(&p)),
            "only the subtree's processes: {stack}"
        );
    }
}

/// A service restarted (its cgroup removed and made again at the path):
/// the new cgroup's process is found by the look that finds the cgroup.
#[test]
fn a_cgroup_followed_by_its_process_list_is_traced_again_when_made_again() {
    restarted_service_traced_again("cgroup-by-pids-restart", true);
}
