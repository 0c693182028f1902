//! Exact per-call-site numbers for every hooked glibc function.

use serde_json::Value;

use crate::harness::{
    compile_c, scratch,
    sites::{
        assert_site_stacks_complete, assert_sites_exact, per_site, trace_formats, trace_sites_with,
        Reports, EXPECTED_PER_THREAD, FP_FLAGS, O0_FLAGS, O2_FLAGS,
    },
    Target,
};

fn trace_sites(tag: &str, cflags: &[&str], tracer_args: &[&str]) -> Reports {
    let bin = compile_c("sites", tag, cflags);
    trace_formats(&bin, &[], &format!("sites-{tag}"), tracer_args)
}

/// Exact numbers (`unwind`: the mode the report must name; tables is the
/// default), the main thread's chain in collapsed output, loss
/// counters on stderr, and a readable text report.
fn assert_reports(r: &Reports, unwind: &str) {
    assert_sites_exact(&r.json);
    assert_eq!(r.json["end_reason"], "interrupted (SIGINT)");
    assert_eq!(r.json["sample_rate"], 1);
    assert_eq!(r.json["unwind"], unwind);
    // Collapsed: root first, in-use bytes; the main thread's chain for every
    // site that keeps memory, with the main thread's exact bytes.
    for (site, [inuse, ..]) in EXPECTED_PER_THREAD {
        let chain = format!(";main;run_sites;{site} {inuse}");
        if *inuse > 0 {
            assert!(
                r.collapsed.lines().any(|l| l.ends_with(&chain)),
                "no collapsed line ending in {chain:?}:\n{}",
                r.collapsed
            );
        } else {
            assert!(
                !r.collapsed.contains(&format!(";{site} ")),
                "{site} keeps nothing:\n{}",
                r.collapsed
            );
        }
    }
    assert!(
        r.collapsed_stderr.contains("Losses"),
        "loss counters on stderr: {}",
        r.collapsed_stderr
    );
    for needle in ["site_realloc", "run_sites", "main", "Losses", "sites.c"] {
        assert!(
            r.text.contains(needle),
            "text report lacks {needle:?}:\n{}",
            r.text
        );
    }
}

/// Every allocating function's hook has `status`; free is a plain uprobe.
fn assert_hook_kind(report: &Value, status: &str) {
    for h in report["hooks"].as_array().expect("hooks") {
        let (function, got) = (
            h["function"].as_str().unwrap_or(""),
            h["status"].as_str().unwrap_or(""),
        );
        if function == "free" {
            assert_eq!(got, "attached", "{h}");
        } else if got.starts_with("attached") {
            assert_eq!(got, status, "{h}");
        }
    }
}

#[test]
fn frame_pointer_build_exact_numbers_with_fp_unwinding() {
    // Also the fallback from uprobe sessions: a uprobe and a uretprobe each.
    // The kernel's stack map keeps one stack per hash bucket: two of the
    // test's few dozen stacks in one bucket lose the second's samples
    // (counted as stack_lost), about one run in fifty with the default
    // 16384 buckets. Eight times the buckets keeps that out of the suite.
    let r = trace_sites(
        "fp-fp",
        FP_FLAGS,
        &[
            "--unwind",
            "fp",
            "--uprobe-sessions",
            "off",
            "--stack-storage-size",
            "131072",
        ],
    );
    assert_reports(&r, "fp");
    assert_hook_kind(&r.json, "attached");
}

#[test]
fn frame_pointer_build_exact_numbers_with_dwarf_unwinding() {
    let r = trace_sites("fp-dwarf", FP_FLAGS, &["--unwind", "dwarf"]);
    assert_reports(&r, "dwarf");
    assert_site_stacks_complete(&r.json);
}

#[test]
fn o2_without_frame_pointers_gives_the_same_numbers_and_complete_stacks() {
    let r = trace_sites("O2-dwarf", O2_FLAGS, &["--unwind", "dwarf"]);
    assert_reports(&r, "dwarf");
    assert_site_stacks_complete(&r.json);
    // This kernel (6.18) has uprobe sessions: they must be what ran.
    assert_hook_kind(&r.json, "attached (uprobe session)");
}

#[test]
fn o0_build_gives_the_same_numbers_and_complete_stacks() {
    let r = trace_sites("O0-tables", O0_FLAGS, &[]);
    assert_reports(&r, "tables");
    assert_site_stacks_complete(&r.json);
}

/// Probe placement moves probes off the symbols (onto instructions the
/// kernel emulates) without changing a single number.
#[test]
fn probes_at_the_symbols_and_at_emulated_offsets_give_the_same_numbers() {
    let placed = trace_sites("O2-placed", O2_FLAGS, &[]);
    let at_symbols = trace_sites("O2-symbols", O2_FLAGS, &["--probe-placement", "entry"]);
    for r in [&placed, &at_symbols] {
        assert_reports(r, "tables");
    }
    assert_eq!(per_site(&placed.json), per_site(&at_symbols.json));
    let free_hook = |r: &Reports| -> (u64, u64, String) {
        let h = r.json["hooks"]
            .as_array()
            .expect("hooks")
            .iter()
            .find(|h| h["function"] == "free")
            .expect("free is hooked")
            .clone();
        (
            h["offset"].as_u64().expect("offset"),
            h["probe_offset"].as_u64().expect("probe_offset"),
            h["placement"].as_str().unwrap_or_default().to_string(),
        )
    };
    // glibc's free starts with `test rdi,rdi`, which the kernel single-steps.
    let (symbol, probe, why) = free_hook(&placed);
    assert!(
        probe > symbol && why.contains("emulated"),
        "{symbol:#x} {probe:#x} {why}"
    );
    let (symbol, probe, why) = free_hook(&at_symbols);
    assert_eq!(probe, symbol, "{why}");
}

/// The JSON report writes each distinct frame once, in the top-level
/// table, in order of first appearance, and every stack's frames are
/// indices into it (read here raw, without `parse_report`).
#[test]
fn json_report_writes_each_frame_once_and_stacks_as_indices() {
    let bin = compile_c("sites", "O2-table", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let (resolved, _) = trace_sites_with(&mut target, "json-table", true, libc::SIGINT, &[]);
    assert_sites_exact(&resolved);
    let text = std::fs::read_to_string(scratch("json-table.json")).expect("read the report");
    let raw: Value = serde_json::from_str(&text).expect("report is JSON");
    assert_eq!(raw["format"], "memtrace-bpf/2");
    let table = raw["frames"].as_array().expect("a frame table");
    for (i, frame) in table.iter().enumerate() {
        assert!(frame["function"].is_string(), "table frame {i}: {frame}");
        assert!(
            !table[..i].contains(frame),
            "frame {frame} twice in the table"
        );
    }
    // Walking the stacks in report order meets the indices in order: 0,
    // then 1 or an old one, then 2 or an old one...
    let mut next = 0;
    let mut uses = vec![0usize; table.len()];
    for stack in raw["stacks"].as_array().expect("stacks") {
        for ix in stack["frames"].as_array().expect("frame indices") {
            let ix = ix.as_u64().unwrap_or_else(|| panic!("index {ix}")) as usize;
            assert!(
                ix <= next && ix < table.len(),
                "index {ix}, next new {next}"
            );
            next = next.max(ix + 1);
            uses[ix] += 1;
        }
    }
    assert_eq!(next, table.len(), "every table frame is used");
    // The sites share their root: each `main` frame (one per call site in
    // it) is in the table once, and serves the main thread's stacks.
    let main_uses: usize = (0..table.len())
        .filter(|&i| table[i]["function"] == "main")
        .map(|i| uses[i])
        .sum();
    assert!(main_uses >= 5, "main in {main_uses} stacks");
    let references: usize = uses.iter().sum();
    assert!(
        references > 2 * table.len(),
        "{references} frame references to {} table frames",
        table.len()
    );
    // One line per stack: the file is not one line per number.
    let stacks = raw["stacks"].as_array().expect("stacks").len();
    let stack_lines = text
        .lines()
        .filter(|l| l.trim_start().starts_with("{\"pid\":") && l.contains("\"frames\":["))
        .count();
    assert_eq!(stack_lines, stacks, "{text}");
}
