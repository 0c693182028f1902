//! Debian's ripgrep, a Rust program nobody here wrote, built without frame
//! pointers, whose main thread has frames larger than any stack copy
//! (15 KiB): started by the tracer, exact mode, the real default ring
//! buffer. The target is at least 95 % of stacks, and of in-use and
//! allocated bytes, under complete stacks (heaptrack: 100 %); with the
//! kernel walking from unwind tables every stack measured was complete
//! (docs/unwind-tables.md), and no event may be lost.

use serde_json::Value;

use crate::harness::{sites::assert_no_losses, JsonTracer};

/// Installed by `cargo xtask setup` (Debian's ripgrep package).
const RG: &str = "/usr/bin/rg";

/// The share of `field` (over all stacks) held by stacks that are
/// complete (not truncated).
fn complete_share(report: &Value, field: &str) -> f64 {
    let stacks = report["stacks"].as_array().expect("stacks");
    let total: u64 = stacks.iter().map(|s| s[field].as_u64().expect(field)).sum();
    let complete: u64 = stacks
        .iter()
        .filter(|s| s["truncated"] == false)
        .map(|s| s[field].as_u64().expect(field))
        .sum();
    assert!(total > 0, "no {field} at all");
    complete as f64 / total as f64
}

#[test]
fn ripgrep_searching_a_tree_has_complete_stacks_and_loses_nothing() {
    // A tree of a few thousand files: rg's walker, its thread pool and its
    // searchers all allocate.
    let tree = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let (report, out) = JsonTracer::spawn(
        "ripgrep",
        &[
            "--ringbuf-mb",
            "16",
            "--verbose",
            "--",
            RG,
            "-c",
            "the",
            tree,
        ],
    )
    .finish();
    assert_no_losses(&report);
    let stacks = report["stacks"].as_array().expect("stacks");
    assert!(stacks.len() > 50, "few stacks: {}", stacks.len());
    let complete = stacks.iter().filter(|s| s["truncated"] == false).count();
    let share = complete as f64 / stacks.len() as f64;
    let cut: Vec<_> = stacks
        .iter()
        .filter(|s| s["truncated"] != false)
        .take(5)
        .map(|s| {
            s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .map(|f| f["function"].as_str().unwrap_or("?").to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        share >= 0.95,
        "{complete} of {} stacks complete; some cut: {cut:#?}\n{}",
        stacks.len(),
        out.stderr
    );
    for field in ["inuse_bytes", "alloc_bytes"] {
        let s = complete_share(&report, field);
        assert!(
            s >= 0.95,
            "{field}: {:.1} % under complete stacks; cut: {cut:#?}",
            100.0 * s
        );
    }
    // Debian strips rg (no symbols), so its frames are named by module and
    // offset: most stacks cross rg's own code on their way to `_start` or
    // `clone3`.
    let through_rg = stacks
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .any(|f| f["module"].as_str().is_some_and(|m| m.ends_with("/rg")))
        })
        .count();
    assert!(
        through_rg * 2 > stacks.len(),
        "{through_rg} of {} stacks cross /usr/bin/rg",
        stacks.len()
    );
}
