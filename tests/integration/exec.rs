//! A traced process that calls exec: the old image's live blocks leave the
//! in-use numbers, the new image's stacks are unwound and named with its
//! own mappings, and an allocator the new image brings is hooked.

use serde_json::Value;

use crate::harness::{
    compile_c,
    http::{get_text, served_addr},
    parse_report,
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
    // The new image's malloc is jemalloc's: glibc's probes, bound to this
    // process alone, are detached.
    assert!(
        stderr.contains("memtrace-bpf: unhooked glibc ("),
        "{stderr}"
    );
    assert_exec_numbers(&report);
    let allocators = &report["processes"][0]["allocators"];
    assert_eq!(allocators[0]["kind"], "jemalloc", "{allocators}");
}

/// Images of exec_loop (`exec_loop N` keeps N blocks of 1000 bytes at
/// site_each_image) traced after the spin.
const IMAGES: u64 = 6;

/// The served profile's in-use objects at `site`, once they are `want`:
/// asked again until they are (the tracer drains its events on its own
/// time). Panics, with what it saw last, if they never are.
fn wait_for_inuse(addr: &str, site: &str, want: u64) {
    let mut last = (None, Value::Null);
    for _ in 0..600 {
        let (status, body) = get_text(addr, "/profile.json");
        assert_eq!(status, 200, "{body}");
        let profile = parse_report(&body);
        let got = per_calling_site(&profile).get(site).copied();
        if got.is_some_and(|v| v[1] == want) {
            return;
        }
        last = (got, profile);
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (got, profile) = last;
    panic!(
        "{site}: {want} blocks in use never served; last {got:?}\nstacks: {:#}\nnotes: {}",
        profile["stacks"], profile["notes"]
    );
}

#[test]
fn pid_follows_a_process_that_execs_while_probes_are_attached_and_after() {
    let bin = compile_c("exec_loop", "exec-loop", O2_FLAGS);
    // Spinning: a new image every millisecond or two while the tracer
    // reads the process and attaches its probes.
    let mut target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::start("exec-loop", &["--pid", &pid, "--serve", "127.0.0.1:0"]);
    let addr = served_addr(&mut tracer);
    target.send("stop spinning");
    for n in 1..=IMAGES {
        target.wait_for(&format!("image {n} ready"));
        if n % 2 == 0 {
            // Exec'ed from a thread: the probes bound to the main task
            // went with it, and are attached again for the new one.
            tracer.stderr.wait_for(
                "exec'ed from a thread other than its main one",
                "the tracer attaches the probes again",
            );
        }
        target.send("go");
        target.wait_for(&format!("image {n} done"));
        // Named with this image's maps before the next replaces it.
        wait_for_inuse(&addr, "site_each_image", n);
        if n < IMAGES {
            target.send("next");
        }
    }
    let (report, out) = tracer.stop();
    let sum: u64 = (1..=IMAGES).sum();
    let got = per_calling_site(&report);
    // The last image's blocks are in use; the others' went with their
    // image, at its exec.
    assert_eq!(
        got.get("site_each_image"),
        Some(&[IMAGES * 1000, IMAGES, sum * 1000, sum]),
        "{got:#?}\n{}",
        out.stderr
    );
    let notes = report["notes"].to_string();
    assert!(
        notes.contains(&format!(
            "process {pid} exec'ed from a thread other than its main one 3 times"
        )),
        "{notes}"
    );
    assert!(
        report["processes"][0]["command"]
            .as_str()
            .is_some_and(|c| c.ends_with(&format!(" {IMAGES}"))),
        "{}",
        report["processes"]
    );
}
