//! Several processes: every process running a binary (`--binary`), and
//! every process on the machine (no target, filtered by `--comm`).

use serde_json::Value;

use crate::harness::{
    compile_c, pids, scratch,
    sites::{at_exit_by_leaf, per_site, EXPECTED_PER_THREAD, O2_FLAGS},
    JsonTracer, Target,
};

/// Two targets run their 20000-allocation churn at once into one tracer,
/// each sample a copy of 8 KiB of stack, while the suite keeps both cores
/// busy: the ring buffer must hold such a burst (it overflowed, counted,
/// in about one suite run in five at the harness's 256 MiB).
const TWO_TARGETS_RINGBUF_MB: &str = "1024";

/// The report's per-site numbers for one process equal the known ones.
fn assert_process_exact(report: &Value, pid: u32) {
    let mine = serde_json::json!({
        "stacks": report["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .filter(|s| s["pid"] == pid)
            .cloned()
            .collect::<Vec<_>>()
    });
    let got = per_site(&mine);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        let want = per_thread.map(|v| v * 2);
        assert_eq!(got.get(*site), Some(&want), "pid {pid}, {site}: {got:#?}");
    }
    let listed = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .any(|p| p["pid"] == pid);
    assert!(
        listed,
        "pid {pid} is not in processes: {}",
        report["processes"]
    );
}

/// `sites` built into `dir/name`, so that two copies differ in path but
/// share a process name.
fn sites_copy(tag: &str, dir: &str, name: &str) -> std::path::PathBuf {
    program_copy("sites", tag, dir, name)
}

/// tests/targets/PROGRAM.c built and copied to `dir/name`.
fn program_copy(program: &str, tag: &str, dir: &str, name: &str) -> std::path::PathBuf {
    let built = compile_c(program, tag, O2_FLAGS);
    let dir = scratch(dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let copy = dir.join(name);
    std::fs::copy(&built, &copy).expect("copy target");
    copy
}

#[test]
fn binary_traces_running_and_newly_started_processes_separately() {
    let bin = sites_copy("binary", "binary-scope", "memtrace_bin");
    let mut early = Target::start(&bin, &[]);
    let tracer = JsonTracer::start(
        "binary",
        &[
            "--ringbuf-mb",
            TWO_TARGETS_RINGBUF_MB,
            "--binary",
            bin.to_str().expect("utf-8 path"),
        ],
    );
    // A second process, started a second after the tracer.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mut late = Target::start(&bin, &[]);
    // New processes are picked up within 100 ms; leave margin.
    std::thread::sleep(std::time::Duration::from_millis(500));
    early.run_sites();
    late.run_sites();
    let (report, _) = tracer.stop();
    assert!(
        report["target"]
            .as_str()
            .unwrap_or("")
            .starts_with("binary "),
        "{}",
        report["target"]
    );
    assert_process_exact(&report, early.pid());
    assert_process_exact(&report, late.pid());
}

#[test]
fn system_wide_sees_two_programs_and_reports_them_separately() {
    let _one_at_a_time = crate::harness::system_wide_lock();
    // Different programs (different files and builds), one process name,
    // so that --comm keeps the rest of the machine out of the trace.
    let a = sites_copy("sw-a", "system-wide-a", "memtrace_sw");
    let b = sites_copy("sw-b", "system-wide-b", "memtrace_sw");
    let mut first = Target::start(&a, &[]);
    let mut second = Target::start(&b, &[]);
    let tracer = JsonTracer::start(
        "system-wide",
        &[
            "--ringbuf-mb",
            TWO_TARGETS_RINGBUF_MB,
            "--comm",
            "memtrace_sw",
        ],
    );
    first.run_sites();
    second.run_sites();
    let (report, out) = tracer.stop();
    assert!(
        out.stderr.contains("every process"),
        "the cost warning: {}",
        out.stderr
    );
    assert_eq!(report["target"], "system-wide");
    assert_process_exact(&report, first.pid());
    assert_process_exact(&report, second.pid());
    let pids = pids(&report);
    assert_eq!(
        pids.len(),
        2,
        "only the two programs: {}",
        report["processes"]
    );
}

/// A copy of `sites` in a chroot of its own, with copies of the dynamic
/// loader and libc: other files than the machine's, as in a container.
fn chroot_with_sites(tag: &str, name: &str) -> std::path::PathBuf {
    let built = compile_c("sites", tag, O2_FLAGS);
    let root = scratch(&format!("{tag}-root"));
    let _ = std::fs::remove_dir_all(&root);
    for (from, to) in [
        (built.as_path(), format!("/{name}")),
        (
            std::path::Path::new("/lib64/ld-linux-x86-64.so.2"),
            "/lib64/ld-linux-x86-64.so.2".to_string(),
        ),
        (
            std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
            "/lib/x86_64-linux-gnu/libc.so.6".to_string(),
        ),
    ] {
        let dest = root.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
    root
}

#[test]
fn system_wide_hooks_the_allocators_of_programs_started_during_the_trace() {
    let _one_at_a_time = crate::harness::system_wide_lock();
    const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
    let name = "memtrace_swlate";
    let jemalloc_prog = sites_copy("sw-late", "system-wide-late", name);
    let root = chroot_with_sites("sw-chroot", name);
    let mut tracer = JsonTracer::start(
        "system-wide-late",
        &[
            "--ringbuf-mb",
            TWO_TARGETS_RINGBUF_MB,
            "--verbose",
            "--comm",
            name,
        ],
    );
    // Started after the tracer: jemalloc, which no process used before,
    // and a libc that is another file (in a chroot, like a container's).
    let mut with_jemalloc =
        Target::start_with_env(&jemalloc_prog, &[], &[("LD_PRELOAD", JEMALLOC)]);
    tracer.stderr.wait_for(
        &format!("pid {} uses jemalloc ({JEMALLOC})", with_jemalloc.pid()),
        "jemalloc hooked on exec",
    );
    let root_arg = root.to_str().expect("utf-8 path");
    let mut in_chroot = Target::start(
        std::path::Path::new("/usr/sbin/chroot"),
        &[root_arg, &format!("/{name}")],
    );
    tracer.stderr.wait_for(
        &format!("pid {} uses glibc", in_chroot.pid()),
        "the chroot's libc hooked on exec",
    );
    with_jemalloc.run_sites();
    in_chroot.run_sites();
    let (report, _) = tracer.stop();
    assert_process_exact(&report, with_jemalloc.pid());
    assert_process_exact(&report, in_chroot.pid());
    let kinds = |pid: u32| {
        report["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .map(|p| p["allocators"][0]["kind"].clone())
    };
    assert_eq!(kinds(with_jemalloc.pid()), Some("jemalloc".into()));
    assert_eq!(kinds(in_chroot.pid()), Some("glibc".into()));
}

/// Processes that start, allocate and exit within a millisecond are all
/// traced: a probe on the program's entry point adds each to the traced set
/// in the kernel, before its main runs.
#[test]
fn binary_traces_every_short_lived_process_from_its_entry_point() {
    let bin = program_copy(
        "first_line",
        "binary-quick",
        "binary-quick",
        "memtrace_quick",
    );
    let tracer = JsonTracer::start(
        "binary-quick",
        &["--binary", bin.to_str().expect("utf-8 path"), "--verbose"],
    );
    let mut pids = Vec::new();
    for _ in 0..10 {
        let mut child = std::process::Command::new(&bin).spawn().expect("start");
        pids.push(child.id());
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), Some(3));
    }
    let (report, out) = tracer.stop();
    // Every process exited, and their exit events were handled by the
    // tracer's last drain: nothing of theirs is left in the kernel's LIVE
    // map. (In exact mode no reported block enters it: user space holds
    // the live set. The deletion of exited processes' entries when
    // sampling is soak.rs's system-wide test.)
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("LIVE map:"))
        .unwrap_or_else(|| panic!("no LIVE map line in: {}", out.stderr));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(numbers.first(), Some(&0), "{line}");
    for pid in &pids {
        // first_line.c keeps one block of 12345 bytes from main, which it
        // never frees: its exit takes it out of in-use...
        let stacks: Vec<&Value> = report["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .filter(|s| s["pid"] == *pid)
            .collect();
        let sum = |field: &str| -> u64 { stacks.iter().filter_map(|s| s[field].as_u64()).sum() };
        assert_eq!(sum("inuse_bytes"), 0, "pid {pid}: {stacks:?}");
        assert!(sum("alloc_bytes") >= 12345, "pid {pid}: {stacks:?}");
    }
    // ...into "not freed at exit", named for the program. Processes of a
    // few milliseconds may be gone before their maps are read (their
    // frames are then [unknown], a note says so): those that were read
    // share one entry.
    let section = &report["not_freed_at_exit"];
    assert_eq!(section["processes"], 10, "{section}");
    assert_eq!(section["bytes"], 12345 * 10, "{section}");
    assert_eq!(section["objects"], 10, "{section}");
    for entry in section["stacks"].as_array().expect("stacks") {
        let program = entry["program"].as_str().expect("program");
        assert!(program.ends_with("/memtrace_quick"), "{entry}");
    }
    let named = at_exit_by_leaf(&report)
        .get("main")
        .copied()
        .unwrap_or([0; 3]);
    assert_eq!(named[0], 12345 * named[1], "{section}");
    assert_eq!(named[1], named[2], "one block per process: {section}");
}

/// Starts `bin wait` with pid `pid` (the kernel hands out the pid after
/// ns_last_pid), trying again when another process took it first.
fn start_with_pid(bin: &std::path::Path, pid: u32) -> Target {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write /proc/sys/kernel/ns_last_pid (root)");
        let mut target = Target::start(bin, &["wait"]);
        if target.pid() == pid {
            return target;
        }
        target.send("stop");
        target.wait_exit();
    }
    panic!("could not start a process with pid {pid}");
}

/// A pid reused by a later process is a new process: the report lists both
/// under the pid, told apart by their start times; the first one's block
/// is "not freed at exit", the second's is in use, and no note says the
/// pid called exec.
#[test]
fn a_reused_pid_is_reported_as_a_new_process() {
    let bin = program_copy("reuse", "pid-reuse", "pid-reuse", "memtrace_reuse");
    let tracer = JsonTracer::start(
        "pid-reuse",
        &["--binary", bin.to_str().expect("utf-8 path")],
    );
    let mut first = std::process::Command::new(&bin).spawn().expect("start");
    let pid = first.id();
    assert!(first.wait().expect("wait").success());
    // Start times are in clock ticks (10 ms): the second starts in a later
    // one.
    std::thread::sleep(std::time::Duration::from_millis(30));
    // Started: it said "ready", its block is allocated.
    let mut second = start_with_pid(&bin, pid);
    let (report, _) = tracer.stop();
    second.send("stop");
    second.wait_exit();
    let with_pid: Vec<&Value> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"] == pid)
        .collect();
    assert_eq!(with_pid.len(), 2, "{}", report["processes"]);
    assert_eq!(with_pid[0]["exited"], true, "{}", with_pid[0]);
    assert_eq!(with_pid[1]["exited"], false, "{}", with_pid[1]);
    assert!(with_pid[0]["start_time"].as_u64() < with_pid[1]["start_time"].as_u64());
    let command = with_pid[1]["command"].as_str().expect("command");
    assert!(command.ends_with("memtrace_reuse wait"), "{command}");
    // The live one's block is in use, under its start time (its stdio
    // buffers are too).
    let inuse: u64 = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["pid"] == pid && s["start_time"] == with_pid[1]["start_time"])
        .filter(|s| s["frames"][0]["function"] == "main")
        .filter_map(|s| s["inuse_bytes"].as_u64())
        .sum();
    assert_eq!(inuse, 4321, "{}", report["stacks"]);
    let section = &report["not_freed_at_exit"];
    assert_eq!(section["processes"], 1, "{section}");
    assert_eq!(section["bytes"], 4321, "{section}");
    let notes = report["notes"].to_string();
    assert!(!notes.contains("exec"), "{notes}");
}

/// Past `--exited-processes N`, the oldest exited processes are folded:
/// one entry per program stands for them, their stacks summed into it, so
/// the report (and what the tracer keeps) is bounded by programs and
/// stacks, not by how many processes ran. Nothing is lost in the sums.
#[test]
fn exited_processes_beyond_the_limit_are_summed_per_program() {
    const RUNS: u64 = 30;
    const KEPT: u64 = 5;
    let bin = program_copy("first_line", "binary-fold", "binary-fold", "memtrace_fold");
    let tracer = JsonTracer::start(
        "binary-fold",
        &[
            "--binary",
            bin.to_str().expect("utf-8 path"),
            "--exited-processes",
            &KEPT.to_string(),
        ],
    );
    for _ in 0..RUNS {
        let status = std::process::Command::new(&bin).status().expect("run");
        assert_eq!(status.code(), Some(3));
    }
    let (report, _) = tracer.stop();
    let processes = report["processes"].as_array().expect("processes");
    let groups: Vec<&Value> = processes.iter().filter(|p| p["folded"] != 0).collect();
    assert_eq!(groups.len(), 1, "{}", report["processes"]);
    let group = groups[0];
    assert_eq!(group["pid"], 0, "{group}");
    assert!(
        group["program"]
            .as_str()
            .is_some_and(|p| p.ends_with("/memtrace_fold")),
        "{group}"
    );
    let individual = processes.iter().filter(|p| p["folded"] == 0).count() as u64;
    assert_eq!(individual, KEPT, "{}", report["processes"]);
    assert_eq!(group["folded"], RUNS - KEPT, "{group}");
    // Each run allocated its 12345 bytes in main and never freed them: all
    // of it is in the stacks' allocation totals and "not freed at exit",
    // folded or not.
    let stacks = report["stacks"].as_array().expect("stacks");
    let folded = stacks
        .iter()
        .filter(|s| s["exited_group"] == group["program"]);
    assert!(folded.clone().count() > 0, "no folded stack: {stacks:?}");
    assert!(folded
        .clone()
        .all(|s| s["pid"] == 0 && s["inuse_bytes"] == 0));
    let objects: u64 = stacks
        .iter()
        .filter(|s| s["alloc_bytes"].as_u64().is_some_and(|b| b >= 12345))
        .filter_map(|s| s["alloc_objects"].as_u64())
        .sum();
    assert!(
        objects >= RUNS,
        "{objects} objects of at least 12345 bytes: {stacks:?}"
    );
    let section = &report["not_freed_at_exit"];
    assert_eq!(section["bytes"], 12345 * RUNS, "{section}");
    assert_eq!(section["processes"], RUNS, "{section}");
    // Each run left one block: the stacks count every run, folded or not
    // (a folded group was counted as one process).
    let by_processes: u64 = section["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter_map(|s| s["processes"].as_u64())
        .sum();
    assert_eq!(by_processes, RUNS, "{section}");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "{RUNS} processes exited during the trace; {RUNS} of them left"
        )),
        "{notes}"
    );
}
