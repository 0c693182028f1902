//! Temporary allocations (freed by the allocating thread before its next
//! allocation) counted exactly on tests/targets/temporary.c, whose churn
//! is known; null per stack when sampling.

use crate::harness::{
    compile_c,
    sites::{assert_no_losses, O0_FLAGS},
    JsonTracer,
};
use serde_json::Value;

/// Leaf site: (temporary objects, temporary bytes, allocations).
const EXPECTED: &[(&str, [u64; 3])] = &[
    ("pair", [1000, 64_000, 1000]),
    ("first", [0, 0, 100]),
    ("second", [100, 1600, 100]),
    ("cross", [0, 0, 50]),
    // 10 malloc(32), each realloc'ed to 4096: the 10 new blocks are.
    ("grown", [10, 40_960, 20]),
    ("kept", [0, 0, 1]),
];

/// [temporary objects, temporary bytes, allocations] per leaf function.
fn temporaries(report: &Value) -> std::collections::BTreeMap<String, [u64; 3]> {
    let mut sums = std::collections::BTreeMap::new();
    for s in report["stacks"].as_array().expect("stacks") {
        // read_json resolved the frame indices.
        let name = s["frames"][0]["function"].as_str().unwrap_or("");
        let e: &mut [u64; 3] = sums.entry(name.to_string()).or_default();
        e[0] += s["temporary_objects"].as_u64().expect("temporary_objects");
        e[1] += s["temporary_bytes"].as_u64().expect("temporary_bytes");
        e[2] += s["alloc_objects"].as_u64().expect("alloc_objects");
    }
    sums
}

#[test]
fn temporary_allocations_are_counted_exactly() {
    let bin = compile_c("temporary", "exact", O0_FLAGS);
    let (report, out) = JsonTracer::spawn("temporary", &["--".as_ref(), bin.as_os_str()]).finish();
    assert!(out.stdout.contains("done"), "{}", out.stdout);
    assert_no_losses(&report);
    let got = temporaries(&report);
    for (site, want) in EXPECTED {
        assert_eq!(got.get(*site), Some(want), "{site}: {got:#?}");
    }
    // The process's total is its stacks' (glibc's own allocations at
    // thread creation are not freed at once: none of them counts).
    let process = &report["processes"][0];
    let sum: [u64; 2] = got.values().fold([0, 0], |a, s| [a[0] + s[0], a[1] + s[1]]);
    assert_eq!(
        [
            process["temporary"]["objects"].as_u64().unwrap_or(u64::MAX),
            process["temporary"]["bytes"].as_u64().unwrap_or(u64::MAX)
        ],
        sum,
        "{process}"
    );
    assert_eq!(sum, [1110, 64_000 + 1600 + 40_960]);
    assert_eq!(report["temporary"]["objects"], 1110);
}

#[test]
fn sampled_traces_leave_temporaries_out() {
    let bin = compile_c("temporary", "sampled", O0_FLAGS);
    let (report, _) = JsonTracer::spawn(
        "temporary-sampled",
        &["--sample-rate", "4096", "--", bin.to_str().expect("path")],
    )
    .finish();
    assert_eq!(report["temporary"], Value::Null);
    assert_eq!(report["processes"][0]["temporary"], Value::Null);
    for s in report["stacks"].as_array().expect("stacks") {
        assert_eq!(s["temporary_objects"], Value::Null, "{s}");
    }
}
