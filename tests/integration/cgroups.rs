//! `--cgroup PATH` and process identity: a cgroup v2
//! subtree traced alone, processes moved into it during the trace,
//! system-wide reports grouped by cgroup, a process in its own pid and
//! mount namespace, and the errors for paths that are no cgroup v2.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

use crate::harness::{
    cgroup::{v1_mount, v2_mount, V2Cgroup},
    compile_c, scratch,
    sites::{per_site, EXPECTED_PER_THREAD, O2_FLAGS, THREADS},
    JsonTracer, Target, TRACER,
};

/// Several targets run their 20000-allocation churn at once into one
/// tracer (as in scopes.rs).
const RINGBUF_MB: &str = "1024";

/// `sites` built and copied to a scratch `dir/name`.
pub(crate) fn sites_copy(tag: &str, name: &str) -> PathBuf {
    let built = compile_c("sites", tag, O2_FLAGS);
    let dir = scratch(tag);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let copy = dir.join(name);
    std::fs::copy(&built, &copy).expect("copy target");
    copy
}

/// Process `pid`'s per-site numbers are exactly the known ones.
pub(crate) fn assert_process_exact(report: &Value, pid: u32) {
    let got = per_site(&crate::forks::only_pid(report, u64::from(pid)));
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS);
        assert_eq!(got.get(*site), Some(&want), "pid {pid}, {site}: {got:#?}");
    }
}

/// The group of `pid` in the report's `groups`: its per-site numbers are
/// exactly those of `n` sites processes, and its counts the sum of its
/// processes' stacks (each process's start-up allocations included).
fn assert_group_exact(report: &Value, pid: u32, n: u64) -> &Value {
    let groups = report["groups"].as_array().expect("groups");
    let group = groups
        .iter()
        .find(|g| {
            g["pids"]
                .as_array()
                .is_some_and(|p| p.contains(&pid.into()))
        })
        .unwrap_or_else(|| panic!("no group has pid {pid}: {groups:#?}"));
    let pids: Vec<u64> = group["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(pids.len() as u64, n, "{group}");
    let stacks: Vec<Value> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["pid"].as_u64().is_some_and(|p| pids.contains(&p)))
        .cloned()
        .collect();
    let got = per_site(&serde_json::json!({ "stacks": stacks }));
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * THREADS * n);
        assert_eq!(
            got.get(*site),
            Some(&want),
            "group {}, {site}",
            group["group"]
        );
    }
    for key in [
        "inuse_bytes",
        "inuse_objects",
        "alloc_bytes",
        "alloc_objects",
    ] {
        let sum: u64 = stacks.iter().filter_map(|s| s[key].as_u64()).sum();
        assert_eq!(group[key].as_u64(), Some(sum), "{key}: {group}");
    }
    group
}

#[test]
fn cgroup_traces_its_subtree_only_with_processes_moved_in_during_the_trace() {
    let top = V2Cgroup::new("scope");
    let (a, b) = (top.child("a"), top.child("b"));
    let bin = sites_copy("cgroup-scope", "memtrace_cg");
    let mut in_a = Target::start(&bin, &[]);
    a.add(in_a.pid());
    let mut in_b = Target::start(&bin, &[]);
    b.add(in_b.pid());
    let mut outside = Target::start(&bin, &[]);
    let mut moved = Target::start(&bin, &[]);
    let mut moved_below = Target::start(&bin, &[]);
    let tracer = JsonTracer::start(
        "cgroup-scope",
        &["--ringbuf-mb", RINGBUF_MB, "--cgroup", &a.path()],
    );
    // During the trace: one process moved into the cgroup, one into a
    // cgroup made below it. Each move is done when its write returns, and
    // the processes allocate only after it ("go").
    a.add(moved.pid());
    let below = a.child("late");
    below.add(moved_below.pid());
    for t in [
        &mut in_a,
        &mut in_b,
        &mut outside,
        &mut moved,
        &mut moved_below,
    ] {
        t.run_sites();
    }
    let (report, _) = tracer.stop();
    assert_eq!(report["target"], format!("cgroup {}", a.path()));
    for pid in [in_a.pid(), moved.pid(), moved_below.pid()] {
        assert_process_exact(&report, pid);
    }
    for pid in [in_b.pid(), outside.pid()] {
        let stacks = crate::forks::only_pid(&report, u64::from(pid));
        assert_eq!(
            stacks["stacks"].as_array().map(Vec::len),
            Some(0),
            "pid {pid}"
        );
    }
    assert_eq!(
        crate::harness::process_entry(&report, in_a.pid())["cgroup"],
        a.path()
    );
    assert_eq!(
        crate::harness::process_entry(&report, moved.pid())["cgroup"],
        a.path()
    );
    assert_eq!(
        crate::harness::process_entry(&report, moved_below.pid())["cgroup"],
        below.path()
    );
    let traced = [in_a.pid(), moved.pid(), moved_below.pid()];
    for stack in report["stacks"].as_array().expect("stacks") {
        let pid = stack["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
        assert!(
            pid.is_some_and(|p| traced.contains(&p)),
            "only the cgroup's three processes: {stack}"
        );
    }
}

/// A service restarted, as systemd does it: its process killed, its
/// cgroup removed, a cgroup made again at the same path and a new process
/// started in it. The path is what is traced: the new process's numbers
/// are exact, and stderr and the report say when the cgroup went and
/// came back.
#[test]
fn a_cgroup_removed_and_made_again_is_traced_again_and_said() {
    restarted_service_traced_again("cgroup-restart", false);
}

/// The test above; `by_processes`: with the cgroup followed by its process
/// list (cgroup_by_pids.rs), where a process moved in is traced from the
/// tracer's next look, which it says with --verbose.
pub(crate) fn restarted_service_traced_again(tag: &str, by_processes: bool) {
    let top = V2Cgroup::new(tag);
    let bin = sites_copy(tag, "memtrace_cgre");
    let service = top.child("service");
    let path = service.path();
    let mut first = Target::start(&bin, &[]);
    service.add(first.pid());
    let mut args = vec!["--ringbuf-mb", RINGBUF_MB, "--cgroup", &path];
    let mut env = Vec::new();
    if by_processes {
        args.push("--verbose");
        env.push(("MEMTRACE_BPF_TEST_CGROUP_BY_PROCESSES", "1"));
    }
    let mut tracer = JsonTracer::start_with_env(tag, &args, &env);
    first.run_sites();
    let first_pid = first.pid();
    drop(first);
    // Removed once its process is gone (the drop waits for that).
    drop(service);
    tracer
        .stderr
        .wait_for("was removed", "the tracer sees the cgroup go");
    let service = top.child("service");
    tracer
        .stderr
        .wait_for("was made again", "the tracer sees the cgroup back");
    let mut second = Target::start(&bin, &[]);
    service.add(second.pid());
    if by_processes {
        tracer.stderr.wait_for(
            &format!("pid {} uses ", second.pid()),
            "the new process found",
        );
    }
    second.run_sites();
    let (report, _) = tracer.stop();
    assert_process_exact(&report, second.pid());
    // The first process's blocks went with it; what it allocated stays.
    let got = per_site(&crate::forks::only_pid(&report, u64::from(first_pid)));
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let allocated = got.get(*site).map(|v| [v[2], v[3]]);
        let want = [per_thread[2] * THREADS, per_thread[3] * THREADS];
        assert_eq!(allocated, Some(want), "pid {first_pid}, {site}: {got:#?}");
    }
    let notes = report["notes"].to_string();
    let said = format!("the cgroup {path} was removed during the trace: at ");
    assert!(notes.contains(&said), "{notes}");
    assert!(notes.contains(", made again at "), "{notes}");
}

#[test]
fn system_wide_grouped_by_cgroup_gives_each_cgroup_its_own_numbers() {
    let _one_at_a_time = crate::harness::system_wide_lock();
    let top = V2Cgroup::new("group-by");
    let (a, b) = (top.child("a"), top.child("b"));
    let name = "memtrace_cggrp";
    let bin = sites_copy("cgroup-group-by", name);
    let mut targets: Vec<Target> = (0..4).map(|_| Target::start(&bin, &[])).collect();
    a.add(targets[0].pid());
    a.add(targets[1].pid());
    b.add(targets[2].pid());
    let outside = targets[3].pid();
    let tracer = JsonTracer::start(
        "cgroup-group-by",
        &[
            "--ringbuf-mb",
            RINGBUF_MB,
            "--comm",
            name,
            "--group-by",
            "cgroup",
        ],
    );
    for t in &mut targets {
        t.run_sites();
    }
    let (report, _) = tracer.stop();
    assert_eq!(report["group_by"], "cgroup");
    assert_eq!(report["groups"].as_array().map(Vec::len), Some(3));
    let ga = assert_group_exact(&report, targets[0].pid(), 2);
    assert_eq!(ga["group"], a.path());
    assert_eq!(ga["cgroup"], a.path());
    let gb = assert_group_exact(&report, targets[2].pid(), 1);
    assert_eq!(gb["group"], b.path());
    let other = assert_group_exact(&report, outside, 1);
    assert_ne!(other["group"], a.path());
    assert_ne!(other["group"], b.path());

    // `report` keeps the trace's grouping, and --group-by changes it.
    // The tracer's own file (the harness inlined the frames of `report`).
    let saved = scratch("cgroup-group-by.json");
    let rerender = |extra: &[&str]| -> Value {
        let out = Command::new(TRACER)
            .arg("report")
            .arg(&saved)
            .args(["--format", "json"])
            .args(extra)
            .output()
            .expect("report");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let kept = rerender(&[]);
    assert_eq!(kept["group_by"], "cgroup");
    assert_eq!(kept["groups"], report["groups"]);
    // By process, the processes are the top level: no groups.
    let by_process = rerender(&["--group-by", "process"]);
    assert_eq!(by_process["group_by"], "process");
    assert_eq!(by_process["groups"], serde_json::json!([]));
    assert_eq!(by_process["totals"], report["totals"]);
}

/// ROOT/NAME: `sites` in a chroot of its own, with copies of the dynamic
/// loader and libc.
fn chroot_with_sites(tag: &str, name: &str) -> PathBuf {
    let built = compile_c("sites", tag, O2_FLAGS);
    let root = scratch(&format!("{tag}-root"));
    let _ = std::fs::remove_dir_all(&root);
    for (from, to) in [
        (built.as_path(), name),
        (
            std::path::Path::new("/lib64/ld-linux-x86-64.so.2"),
            "lib64/ld-linux-x86-64.so.2",
        ),
        (
            std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
            "lib/x86_64-linux-gnu/libc.so.6",
        ),
    ] {
        let dest = root.join(to);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
    root
}

#[test]
fn a_process_in_its_own_namespaces_shows_its_namespace_pid_and_its_own_program() {
    let cgroup = V2Cgroup::new("ns");
    let name = "memtrace_ns";
    let root = chroot_with_sites("cgroup-ns", name);
    let root_arg = root.to_str().expect("utf-8 path");
    let program = format!("/{name}");
    // unshare forks the namespace's first process (pid 1 there), which
    // chroots and runs the program; "ready" comes from it. It is killed
    // with unshare (the target's drop).
    let mut outer = Target::start(
        std::path::Path::new("/usr/bin/unshare"),
        &[
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "/usr/sbin/chroot",
            root_arg,
            &program,
        ],
    );
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", outer.pid()))
        .expect("unshare's children");
    let inner: u32 = children.trim().parse().expect("one child");
    cgroup.add(inner);
    let tracer = JsonTracer::start("cgroup-ns", &["--cgroup", &cgroup.path()]);
    outer.run_sites();
    let (report, _) = tracer.stop();
    assert_process_exact(&report, inner);
    let p = crate::harness::process_entry(&report, inner);
    assert_eq!(p["ns_pid"], 1, "{p}");
    assert_eq!(p["ns_program"], program.as_str(), "{p}");
    assert_eq!(p["command"], program.as_str(), "{p}");
    assert_eq!(p["cgroup"], cgroup.path(), "{p}");
}

/// The tracer's exit status and stderr for `args`.
fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(TRACER)
        .args(args)
        .output()
        .expect("run memtrace-bpf");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn paths_that_are_no_cgroup_v2_are_refused_naming_the_mount() {
    let mount = v2_mount();
    let mount_text = mount.display().to_string();
    let cgroup = V2Cgroup::new("bad-paths");
    let file = cgroup.dir().join("cgroup.procs");
    let mut cases = vec![
        ("memtrace-no-such-cgroup".to_string(), "no such cgroup"),
        (file.display().to_string(), "not a cgroup directory"),
        ("/etc".to_string(), "not a cgroup directory"),
    ];
    // Hybrid hosts (as the CI machine) mount cgroup v1 hierarchies too.
    if let Some(v1) = v1_mount() {
        cases.push((v1.display().to_string(), "cgroup v1"));
    }
    for (path, why) in cases {
        let (status, stderr) = run(&["--cgroup", &path, "-d", "1"]);
        assert_eq!(status, Some(1), "--cgroup {path}: {stderr}");
        assert!(stderr.contains(why), "--cgroup {path}: {stderr}");
        assert!(stderr.contains(&mount_text), "--cgroup {path}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let (status, stderr) = run(&["--cgroup", "", "-d", "1"]);
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("--cgroup"), "{stderr}");
}
