//! A traced process that calls exec: the old image's live blocks leave the
//! in-use numbers, the new image's stacks are unwound and named with its
//! own mappings, and an allocator the new image brings is hooked.

use serde_json::Value;

use crate::harness::{
    compile_c,
    sites::{assert_no_losses, per_calling_site, O2_FLAGS},
    JsonTracer, Target, Tracer,
};

const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// Runs exec_chain under `--pid` with `env`; `between` runs once the second
/// image is up and before it allocates. Returns the report and the stderr.
fn trace_exec_chain(
    tag: &str,
    env: &[(&str, &str)],
    between: impl FnOnce(&mut Tracer),
) -> (Value, String) {
    // One binary per test: tests run in parallel, and a binary being
    // rewritten while another test starts it fails with ETXTBSY.
    let bin = compile_c("exec_chain", tag, O2_FLAGS);
    let mut target = Target::start_with_env(&bin, &[], env);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start(tag, &["--pid", &pid]);
    target.send("go");
    target.wait_for("second ready");
    between(&mut tracer);
    target.send("go");
    target.wait_for("done");
    let (report, out) = tracer.stop();
    (report, out.stderr)
}

fn assert_exec_numbers(report: &Value) {
    let got = per_calling_site(report);
    // Allocated before the exec, gone with the old image.
    assert_eq!(
        got.get("site_before_exec"),
        Some(&[0, 0, 10 * 2000, 10]),
        "{got:#?}"
    );
    assert_eq!(
        got.get("site_after_exec"),
        Some(&[8 * 3000, 8, 8 * 3000, 8]),
        "{got:#?}"
    );
    assert_eq!(
        got.get("site_after_exec_churn"),
        Some(&[0, 0, 100 * 64, 100]),
        "{got:#?}"
    );
    assert!(
        report["notes"]
            .to_string()
            .contains("blocks still live when their process called exec were dropped"),
        "{}",
        report["notes"]
    );
    assert!(
        report["processes"][0]["command"]
            .as_str()
            .unwrap_or("")
            .ends_with("second"),
        "{}",
        report["processes"]
    );
    assert_no_losses(report);
}

#[test]
fn a_process_that_execs_is_followed_into_its_new_image() {
    let (report, _) = trace_exec_chain("exec-same", &[], |_| {});
    assert_exec_numbers(&report);
}

#[test]
fn an_allocator_brought_by_exec_is_hooked() {
    let (report, stderr) = trace_exec_chain(
        "exec-jemalloc",
        &[("EXEC_CHAIN_PRELOAD", JEMALLOC)],
        |tracer| {
            tracer.stderr.wait_for(
                "libjemalloc.so.2",
                "tracer hooks the exec'ed image's jemalloc",
            );
        },
    );
    assert!(stderr.contains("memtrace-bpf: hooked jemalloc"), "{stderr}");
    assert_exec_numbers(&report);
    let allocators = &report["processes"][0]["allocators"];
    assert_eq!(allocators[0]["kind"], "jemalloc", "{allocators}");
}
