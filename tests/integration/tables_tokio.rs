//! `--unwind tables` on a tokio program (tests/targets/tokio_big, release,
//! no frame pointers): `tokio::spawn` moves futures of more than 32 KiB
//! through its frames, and the tasks allocate on the runtime's worker
//! threads. Exact numbers per site, every stack complete, nothing lost at
//! the default ring buffer size: traced by pid after the handshake, and
//! started by the tracer allocating at once (the command is held at its
//! entry point until the libraries the loader mapped are described).

use serde_json::Value;

use crate::harness::{
    function_names as names,
    sites::{assert_no_losses, per_calling_site},
    tokio_big::{tokio_big_binary, EXPECTED, TASKS},
    JsonTracer, Target,
};

/// The tracer's default ring buffer (the harness adds 256 MiB otherwise).
const DEFAULT_RINGBUF: [&str; 2] = ["--ringbuf-mb", "16"];

fn describe(report: &Value) -> String {
    let mut out = String::new();
    for s in report["stacks"].as_array().expect("stacks") {
        out.push_str(&format!(
            "alloc {} B / {} objs, truncated {}: {:?}\n",
            s["alloc_bytes"],
            s["alloc_objects"],
            s["truncated"],
            names(s)
        ));
    }
    out.push_str(&format!("losses: {}\n", report["losses"]));
    out
}

/// Exact per-site numbers; every stack complete (the roots of
/// collect/roots.rs: `_start` for the main thread, `clone3` for the
/// runtime's threads); the site stacks through the task's future and the
/// runtime's worker thread; the spawns of the 32 KiB futures through
/// `tokio::spawn` and `main`; nothing lost.
fn assert_complete_and_exact(report: &Value) {
    let all = describe(report);
    assert_eq!(report["unwind"], "tables");
    assert_no_losses(report);
    let got = per_calling_site(report);
    for (site, want) in EXPECTED {
        assert_eq!(got.get(*site), Some(want), "{site}: {got:#?}\n{all}");
    }
    let stacks = report["stacks"].as_array().expect("stacks");
    for s in stacks {
        assert_eq!(s["truncated"], false, "a stack is cut:\n{all}");
    }
    for s in stacks.iter().filter(|s| {
        names(s)
            .iter()
            .any(|f| f.ends_with("site_task_keep") || f.ends_with("site_task_churn"))
    }) {
        let names = names(s);
        assert!(
            names.iter().any(|f| f.contains("big_task")),
            "not through the task's future: {names:?}"
        );
        assert_eq!(names.last(), Some(&"clone3"), "{names:?}");
    }
    // Box::pin of each 32 KiB future inside tokio::spawn (tokio boxes large
    // futures), under the frames that moved it.
    let spawns: Vec<&Value> = stacks
        .iter()
        .filter(|s| {
            let bytes = s["alloc_bytes"].as_u64().expect("bytes");
            let objects = s["alloc_objects"].as_u64().expect("objects");
            bytes >= 32 * 1024 * objects
                && names(s)
                    .iter()
                    .any(|f| f.starts_with("spawn<tokio_big::big_task::{async_fn_env"))
        })
        .collect();
    let boxes: u64 = spawns
        .iter()
        .map(|s| s["alloc_objects"].as_u64().expect("count"))
        .sum();
    assert_eq!(boxes, TASKS, "{all}");
    for s in spawns {
        let names = names(s);
        assert!(names.contains(&"main"), "{names:?}");
        assert_eq!(names.last(), Some(&"_start"), "{names:?}");
    }
}

#[test]
fn tables_walk_a_tokio_program_that_moves_32_kib_futures_exactly() {
    let mut target = Target::start(tokio_big_binary(), &[]);
    let pid = target.pid().to_string();
    let args = [&["--pid", pid.as_str()][..], &DEFAULT_RINGBUF[..]].concat();
    let tracer = JsonTracer::start("tables-tokio", &args);
    target.run_sites();
    let (report, _) = tracer.stop();
    assert_complete_and_exact(&report);
}

/// Started by the tracer, allocating at once: the walks need libc's
/// mapping from the first allocation on, and none is finished from a
/// stack copy (before the entry stop, every walk through a libc frame was).
#[test]
fn tables_walk_a_tokio_command_from_its_first_allocation() {
    let bin = tokio_big_binary().to_str().expect("utf-8 path");
    let args = [&DEFAULT_RINGBUF[..], &["--verbose", "--", bin, "now"][..]].concat();
    let (report, out) = JsonTracer::spawn("tables-tokio-now", &args).finish();
    assert!(out.status.success(), "{}", out.stderr);
    let walks = out
        .stderr
        .lines()
        .find(|l| l.contains("kernel walks: "))
        .unwrap_or_else(|| panic!("no kernel walks line:\n{}", out.stderr));
    assert!(
        walks.contains(" 0 finished from a stack copy"),
        "walks resumed in user space: {walks}"
    );
    assert_no_losses(&report);
    let got = per_calling_site(&report);
    for (site, want) in EXPECTED {
        let got = got
            .get(*site)
            .unwrap_or_else(|| panic!("no {site}: {got:#?}"));
        // Allocated numbers: what is in use at exit depends on how the
        // report treats an exited process, not on unwinding.
        assert_eq!(got[2..], want[2..], "{site} allocated");
    }
    for s in report["stacks"].as_array().expect("stacks") {
        assert_eq!(s["truncated"], false, "{}", describe(&report));
    }
}
