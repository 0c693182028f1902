//! `--follow-forks`: the children of a traced process (and theirs, and the
//! programs they exec) are traced under their own pids; without the flag
//! the report counts the children that were not traced. A shell's
//! children, and the flag refused where it means nothing: forks_shell.rs.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::harness::{
    compile_c, pids,
    sites::{
        assert_no_losses, per_calling_site, per_site, per_site_by, EXPECTED_PER_THREAD, O2_FLAGS,
    },
    JsonTracer, Target, Tracer,
};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// The report with only the stacks of process `pid`.
pub(crate) fn only_pid(report: &Value, pid: u64) -> Value {
    let stacks: Vec<Value> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["pid"] == pid)
        .cloned()
        .collect();
    serde_json::json!({ "stacks": stacks })
}

/// [inuse bytes, inuse objects, alloc bytes, alloc objects] of the stacks
/// whose leaf is `site`, per pid.
fn site_by_pid(report: &Value, site: &str) -> BTreeMap<u64, [u64; 4]> {
    pids(report)
        .into_iter()
        .filter_map(|pid| Some((pid, *per_site(&only_pid(report, pid)).get(site)?)))
        .collect()
}

/// Child k of forker.c allocated k blocks of k * 1000 bytes and exited
/// without freeing them: not in use any more (no live process holds them)
/// but in "not freed at exit", the three children under one entry.
fn assert_children_exited_unfreed(report: &Value, children: &BTreeMap<u64, [u64; 4]>) {
    let mut sizes: Vec<[u64; 4]> = children.values().copied().collect();
    sizes.sort_unstable();
    let want: Vec<[u64; 4]> = (1..=3u64).map(|k| [0, 0, k * k * 1000, k]).collect();
    assert_eq!(sizes, want, "{children:?}");
    let at_exit = crate::harness::sites::at_exit_by_leaf(report);
    assert_eq!(
        at_exit.get("child_site"),
        Some(&[1000 + 2 * 2000 + 3 * 3000, 1 + 2 + 3, 3]),
        "{}",
        report["not_freed_at_exit"]
    );
}

/// Sites.c's exact numbers (both threads) for process `pid`.
pub(crate) fn assert_sites_exact_for(report: &Value, pid: u64) {
    let got = per_calling_site(&only_pid(report, pid));
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * 2);
        assert_eq!(got.get(*site), Some(&want), "pid {pid}, {site}: {got:#?}");
    }
}

/// Traces `forker ARGS` with `--pid` and `extra` tracer arguments: once it
/// forked and its children allocated (and `between` ran), the tracer is
/// stopped. Returns the report and the target's pid.
fn trace_forker(tag: &str, args: &[&str], extra: &[&str]) -> (Value, u64) {
    let bin = compile_c("forker", tag, O2_FLAGS);
    let mut target = Target::start(&bin, args);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start(tag, &[&["--pid", &pid], extra].concat());
    target.send("go");
    target.wait_for("forked all");
    let (report, _) = tracer.stop();
    (report, u64::from(target.pid()))
}

#[test]
fn a_pid_with_follow_forks_sees_each_childs_allocations_under_its_own_pid() {
    let bin = compile_c("forker", "forks-pid", O2_FLAGS);
    let mut target = Target::start(&bin, &["3", "grandchild"]);
    let pid = target.pid().to_string();
    let scope = ["--pid", pid.as_str(), "--follow-forks"];
    let json = JsonTracer::start("forks-pid", &scope);
    let collapsed = Tracer::start(&[&scope[..], &["--format", "collapsed"]].concat());
    target.send("go");
    target.wait_for("forked all");
    let (report, _) = json.stop();
    collapsed.signal(libc::SIGINT);
    let collapsed_out = collapsed.finish();
    assert!(
        collapsed_out.status.success(),
        "tracer failed: {}",
        collapsed_out.stderr
    );
    let root = u64::from(target.pid());
    let all = pids(&report);
    assert_eq!(all.len(), 5, "forker, 3 children, 1 grandchild: {all:?}");
    assert_eq!(all[0], root);
    // The parent and its thread, under the parent's pid only.
    let parent = site_by_pid(&report, "parent_site");
    assert_eq!(parent, BTreeMap::from([(root, [10_000, 5, 10_000, 5])]));
    let thread = site_by_pid(&report, "thread_site");
    assert_eq!(thread, BTreeMap::from([(root, [6_000, 2, 6_000, 2])]));
    // Child k keeps k blocks of k * 1000 bytes, each child its own pid.
    let children = site_by_pid(&report, "child_site");
    let mut sizes: Vec<[u64; 4]> = children.values().copied().collect();
    sizes.sort_unstable();
    let want: Vec<[u64; 4]> = (1..=3u64)
        .map(|k| [k * k * 1000, k, k * k * 1000, k])
        .collect();
    assert_eq!(sizes, want, "{children:?}");
    let grandchild = site_by_pid(&report, "grandchild_site");
    assert_eq!(
        grandchild.values().collect::<Vec<_>>(),
        [&[21_000, 3, 21_000, 3]]
    );
    let mut seen: Vec<u64> = children.keys().chain(grandchild.keys()).copied().collect();
    seen.push(root);
    seen.sort_unstable();
    let mut listed = all.clone();
    listed.sort_unstable();
    assert_eq!(seen, listed, "one process per site owner");
    assert!(
        !report["notes"].to_string().contains("not traced"),
        "{}",
        report["notes"]
    );
    assert_no_losses(&report);
    // Collapsed: each process under its own root frame.
    let collapsed = &collapsed_out.stdout;
    for (pid, [inuse, ..]) in children.iter().chain(&grandchild) {
        let root_frame = format!("forker-forks-pid (pid {pid});");
        assert!(
            collapsed
                .lines()
                .any(|l| l.starts_with(&root_frame) && l.ends_with(&format!("_site {inuse}"))),
            "no line for pid {pid} with {inuse} bytes:\n{collapsed}"
        );
    }
}

#[test]
fn without_follow_forks_the_report_counts_the_children_not_traced() {
    // 3 children of the target, a grandchild (not the target's child) and
    // a thread (not a process): 3 children counted.
    let (report, root) = trace_forker("forks-counted", &["3", "grandchild"], &[]);
    let note = format!("3 child processes of pid {root} were not traced: use --follow-forks");
    assert!(
        report["notes"]
            .as_array()
            .expect("notes")
            .iter()
            .any(|n| n == &Value::from(note.clone())),
        "{note:?} not in {}",
        report["notes"]
    );
    assert_eq!(pids(&report), [root]);
    let by_leaf = per_site_by(&report, |s| Some(s["pid"].to_string()));
    assert_eq!(by_leaf.len(), 1, "only the target's stacks: {by_leaf:?}");
    let parent = site_by_pid(&report, "parent_site");
    assert_eq!(parent, BTreeMap::from([(root, [10_000, 5, 10_000, 5])]));
    assert!(site_by_pid(&report, "child_site").is_empty());
}

#[test]
fn a_followed_child_that_execs_a_jemalloc_program_is_traced_with_jemalloc_hooked() {
    assert!(
        std::path::Path::new(JEMALLOC).exists(),
        "{JEMALLOC} is missing: run `cargo xtask setup`"
    );
    let sites = compile_c("sites", "forks-exec", O2_FLAGS);
    let bin = compile_c("forker", "forks-exec", O2_FLAGS);
    let sites_arg = sites.to_str().expect("utf-8 path");
    let mut target = Target::start(&bin, &["1", "exec", JEMALLOC, sites_arg]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(
        "forks-exec",
        &["--pid", &pid, "--follow-forks", "--verbose"],
    );
    target.send("go");
    // The exec'd image runs with jemalloc, which nothing had loaded: it is
    // hooked when the tracer sees the exec, before sites is let go.
    let hooked = tracer
        .stderr
        .wait_for("memtrace-bpf: hooked jemalloc", "jemalloc hooked at exec");
    let exec_pid: u64 = hooked
        .rsplit_once("for pid ")
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {hooked:?}"));
    target.send("go");
    target.wait_for("done");
    let (report, _) = tracer.stop();
    assert_sites_exact_for(&report, exec_pid);
    let process = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == exec_pid)
        .unwrap_or_else(|| panic!("{exec_pid} not in {}", report["processes"]))
        .clone();
    assert_eq!(process["allocators"][0]["kind"], "jemalloc", "{process}");
    assert!(
        process["command"]
            .as_str()
            .unwrap_or("")
            .ends_with("sites-forks-exec"),
        "{process}"
    );
    // The child that did not exec, under glibc.
    let child = site_by_pid(&report, "child_site");
    assert_eq!(child.values().collect::<Vec<_>>(), [&[1000, 1, 1000, 1]]);
    assert_no_losses(&report);
}

/// Children that allocate and exit at once: each leaves the traced set at
/// its exit (the kernel's exit event says so: the report marks it exited),
/// and its stacks are named with the mappings it shared with its parent.
#[test]
fn children_that_exit_at_once_are_reported_exited_with_named_stacks() {
    let (report, root) = trace_forker("forks-exit", &["3", "exit"], &["--follow-forks"]);
    let processes = report["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 4, "{}", report["processes"]);
    assert_eq!(processes[0]["pid"], root);
    assert_eq!(processes[0]["exited"], false);
    for child in &processes[1..] {
        assert_eq!(child["exited"], true, "{child}");
        // A forked child runs its parent's program.
        assert_eq!(child["command"], processes[0]["command"], "{child}");
    }
    let children = site_by_pid(&report, "child_site");
    assert_children_exited_unfreed(&report, &children);
    for pid in children.keys() {
        let stacks = only_pid(&report, *pid);
        let frames = &stacks["stacks"][0]["frames"];
        assert_eq!(frames[1]["function"], "main", "pid {pid}: {frames}");
    }
    assert_no_losses(&report);
}

/// Under --binary a forked child runs the binary too: it joins the traced
/// set in the kernel at fork, so children that allocate and exit at once
/// (before any /proc scan could find them) are traced, under their pids.
/// A child that execs another program leaves the set at its exec, in the
/// kernel, before the other program allocates.
#[test]
fn binary_traces_forked_children_from_the_fork() {
    let bin = compile_c("forker", "forks-binary", O2_FLAGS);
    let sites = compile_c("sites", "forks-binary", O2_FLAGS);
    // Preloading glibc's own libc changes nothing: the other program runs
    // with the allocator that the probes (for every process) are on.
    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
    let tracer = JsonTracer::start(
        "forks-binary",
        &["--binary", bin.to_str().expect("utf-8 path")],
    );
    // Started after the tracer: traced from its entry point, in the kernel.
    let sites_arg = sites.to_str().expect("utf-8 path");
    let mut target = Target::start(&bin, &["3", "exit", "exec", LIBC, sites_arg]);
    target.send("go");
    target.wait_for("forked all");
    // The exec'ed sites runs its allocations.
    target.send("go");
    target.wait_for("done");
    let (report, _) = tracer.stop();
    let other = per_calling_site(&report);
    assert!(
        !other.keys().any(|site| site.starts_with("site_")),
        "the other program is not traced: {other:?}"
    );
    assert!(
        report["notes"]
            .to_string()
            .contains("exec'ed another program and was no longer traced"),
        "{}",
        report["notes"]
    );
    let children = site_by_pid(&report, "child_site");
    assert_children_exited_unfreed(&report, &children);
    let root = u64::from(target.pid());
    assert!(!children.contains_key(&root));
    let listed = pids(&report);
    for pid in children.keys().chain([&root]) {
        assert!(listed.contains(pid), "{pid} not in {listed:?}");
    }
    assert_no_losses(&report);
}

/// `--pid --follow-forks` on a process whose children run already: they
/// join at the start and are listed under their own pids.
#[test]
fn children_running_before_the_trace_starts_are_followed_too() {
    let bin = compile_c("forker", "forks-before", O2_FLAGS);
    let mut target = Target::start(&bin, &["2", "grandchild"]);
    target.send("go");
    target.wait_for("forked all");
    let pid = target.pid().to_string();
    let (report, _) = JsonTracer::start("forks-before", &["--pid", &pid, "--follow-forks"]).stop();
    let processes = report["processes"].as_array().expect("processes");
    // The target, its 2 children and the grandchild, all still running.
    assert_eq!(processes.len(), 4, "{}", report["processes"]);
    for p in processes {
        assert_eq!(p["exited"], false, "{p}");
        assert_eq!(p["command"], processes[0]["command"], "{p}");
    }
}

/// Under --binary the processes that exec'ed another program are named in
/// the notes up to a bound (32) and counted beyond it; and what the tracer
/// keeps of each process goes when it exits (session/binary.rs).
#[test]
fn binary_names_a_bounded_number_of_processes_that_execed_away() {
    let bin = compile_c("exec_away", "forks-exec-away", O2_FLAGS);
    let tracer = JsonTracer::start(
        "forks-exec-away",
        &["--binary", bin.to_str().expect("utf-8 path")],
    );
    let mut target = Target::start(&bin, &["40"]);
    target.send("go");
    target.wait_for("done");
    let (report, _) = tracer.stop();
    let notes: Vec<String> = report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .map(|n| n.as_str().unwrap_or_default().to_string())
        .collect();
    let named = notes
        .iter()
        .filter(|n| n.starts_with("process ") && n.contains("exec'ed another program"))
        .count();
    let more: Vec<&String> = notes
        .iter()
        .filter(|n| n.contains("more processes exec'ed another program"))
        .collect();
    assert_eq!(named, 32, "{notes:#?}");
    assert_eq!(more.len(), 1, "{notes:#?}");
    assert!(more[0].starts_with("8 more processes"), "{}", more[0]);
    drop(target);
}
