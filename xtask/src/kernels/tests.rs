//! The matrix's logic without root or a VM: choosing packages, judging
//! results, rendering the table.

use std::time::Duration;

use serde_json::{json, Value};

use super::{
    apt::{image_abi, mirrors, parse_madison, pick_newest},
    judge::{judge, verified, Outcome, Raw, CHECKS, SITES},
    table::{console, markdown, KernelRun},
    KERNELS,
};

const MADISON: &str = "\
linux-image-5.10.0-34-amd64-unsigned | 5.10.237-1 | http://deb.debian.org/debian bullseye/main amd64 Packages
linux-image-5.10.0-35-amd64-unsigned | 5.10.244-1 | http://deb.debian.org/debian-security bullseye-security/main amd64 Packages
linux-image-6.1.0-40-amd64-unsigned | 6.1.153-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
linux-image-6.1.0-9-amd64-unsigned | 6.1.27-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
linux-image-6.12.118+deb13-amd64-unsigned | 6.12.118-1 | http://deb.debian.org/debian trixie/main amd64 Packages
linux-image-6.12.118+deb13-amd64-unsigned | 6.12.118-1 | http://deb.debian.org/debian-security trixie-security/main amd64 Packages
linux-image-6.12.96+deb13-amd64-unsigned | 6.12.96-1 | http://deb.debian.org/debian trixie/main amd64 Packages
linux-image-6.16.3+deb13-amd64-unsigned | 6.16.3-1~bpo13+1 | http://deb.debian.org/debian trixie-backports/main amd64 Packages
linux-binary-unsigned-7.2.13+deb14-amd64 | 7.2.13-1 | http://deb.debian.org/debian sid/main amd64 Packages
linux-binary-unsigned-7.1.9+deb14-amd64 | 7.1.9-2 | http://deb.debian.org/debian sid/main amd64 Packages
";

fn kernel(name: &str) -> &'static super::Kernel {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .expect("a kernel of the matrix")
}

#[test]
fn the_newest_image_of_each_suite_and_series_is_chosen() {
    let candidates = parse_madison(MADISON);
    assert_eq!(candidates.len(), 10);
    let chosen = |name| {
        pick_newest(kernel(name), &candidates).map(|c| (c.package.as_str(), c.suite.as_str()))
    };
    assert_eq!(
        chosen("5.10"),
        Some(("linux-image-5.10.0-35-amd64-unsigned", "bullseye-security"))
    );
    // 6.1.0-9 sorts after 6.1.0-40 by name, not by version.
    assert_eq!(
        chosen("6.1"),
        Some(("linux-image-6.1.0-40-amd64-unsigned", "bookworm"))
    );
    // Not 6.16 from backports (another suite), and 6.1 does not take 6.12.
    assert_eq!(
        chosen("6.12"),
        Some(("linux-image-6.12.118+deb13-amd64-unsigned", "trixie"))
    );
    assert_eq!(
        chosen("newest"),
        Some(("linux-binary-unsigned-7.2.13+deb14-amd64", "sid"))
    );
    assert_eq!(pick_newest(kernel("6.1"), &parse_madison("")), None);
}

#[test]
fn only_plain_amd64_images_count() {
    assert_eq!(
        image_abi("linux-image-5.10.0-35-amd64-unsigned"),
        Some(("5.10.0-35", false))
    );
    assert_eq!(
        image_abi("linux-binary-unsigned-7.2.13+deb14-amd64"),
        Some(("7.2.13+deb14", true))
    );
    for other in [
        "linux-image-6.12.118+deb13-cloud-amd64-unsigned",
        "linux-image-6.12.118+deb13-rt-amd64-unsigned",
        "linux-image-6.12.118+deb13-amd64",
        "linux-image-amd64",
        "linux-binary-unsigned-7.2.13+deb14-cloud-amd64",
    ] {
        assert_eq!(image_abi(other), None, "{other}");
    }
}

#[test]
fn the_mirror_comes_from_the_systems_sources_in_either_form() {
    let deb822 = "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n\n\
                  Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n";
    let other = "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n";
    assert_eq!(
        mirrors(&[deb822.into(), other.into()]),
        Some((
            "http://mirror.example/debian".into(),
            "http://mirror.example/debian-security".into()
        ))
    );
    let one_line = "# comment\ndeb [arch=amd64] http://ftp.example.org/debian bookworm main\n";
    assert_eq!(
        mirrors(&[one_line.into()]),
        Some((
            "http://ftp.example.org/debian".into(),
            "http://ftp.example.org/debian-security".into()
        ))
    );
    assert_eq!(mirrors(&[other.into()]), None);
}

/// A JSON report (frames as indices into a table) with both threads'
/// stacks of the three sites at `scale` times the expected numbers.
fn report(scale: u64, tail: &[&str]) -> Value {
    let mut frames = vec![
        json!({"function": "run_sites"}),
        json!({"function": "main"}),
        json!({"function": "worker"}),
    ];
    let mut stacks = Vec::new();
    for (site, per_thread) in SITES {
        frames.push(json!({ "function": site }));
        let leaf = frames.len() - 1;
        for root in [1, 2] {
            let mut ix = vec![leaf, 0, root];
            for f in tail {
                frames.push(json!({ "function": f }));
                ix.push(frames.len() - 1);
            }
            stacks.push(json!({
                "frames": ix,
                "inuse_bytes": per_thread[0] * scale, "inuse_objects": per_thread[1],
                "alloc_bytes": per_thread[2], "alloc_objects": per_thread[3], "truncated": false,
            }));
        }
    }
    json!({"format": "memtrace-bpf/2", "sample_rate": 1, "frames": frames, "stacks": stacks,
           "losses": {"ringbuf_full": 0, "stack_lost": 0}})
}

fn raw(exit: i32, report: Option<&Value>, stderr: &str) -> Raw {
    Raw {
        exit: Some(exit),
        stderr: stderr.into(),
        report: report.map(Value::to_string),
        seconds: Some(12),
    }
}

#[test]
fn an_exact_check_passes_only_with_exact_numbers_and_complete_stacks() {
    let exact = &CHECKS[0];
    let stderr = "memtrace-bpf: kernel 6.12.118+deb13-amd64: mode: unwind tables, uprobes + uretprobes\nthe return program verified in 274557 instructions\n";
    let good = judge(
        exact,
        &raw(0, Some(&report(1, &["__libc_start_call_main"])), stderr),
        false,
    );
    assert_eq!(good.outcome, Outcome::Pass);
    assert_eq!(
        good.mode.as_deref(),
        Some("unwind tables, uprobes + uretprobes")
    );
    assert_eq!(good.verified, vec![("return".to_owned(), 274_557)]);

    let Outcome::Fail(why) =
        judge(exact, &raw(0, Some(&report(2, &["_start"])), ""), false).outcome
    else {
        panic!("doubled bytes pass");
    };
    assert!(why.contains("site_malloc [40000, 20"), "{why}");
    // Stopping at main is not complete: nothing of libc's start code.
    let Outcome::Fail(why) = judge(exact, &raw(0, Some(&report(1, &[])), ""), false).outcome else {
        panic!("a stack ending at main passes");
    };
    assert!(
        why.starts_with("incomplete stack: site_malloc < run_sites < main"),
        "{why}"
    );
    let mut lossy = report(1, &["_start"]);
    lossy["losses"]["stack_lost"] = json!(3);
    assert_eq!(
        judge(exact, &raw(0, Some(&lossy), ""), false).outcome,
        Outcome::Fail("losses: stack_lost=3".into())
    );
}

#[test]
fn the_loaded_ahead_check_needs_its_mode_line_and_exact_numbers() {
    let ahead = CHECKS.iter().find(|c| c.name == "loaded-ahead").unwrap();
    let good = report(1, &["_start"]);
    let line = "memtrace-bpf: kernel 6.1.0-40-amd64: mode: unwind tables, uprobes + uretprobes, calls in flight in task storage, loaded ahead (settings in a map)\n";
    assert_eq!(
        judge(ahead, &raw(0, Some(&good), line), false).outcome,
        Outcome::Pass
    );
    let Outcome::Fail(why) = judge(ahead, &raw(0, Some(&good), ""), false).outcome else {
        panic!("a trace that loaded its own programs passes");
    };
    assert!(why.contains("not the ones loaded ahead"), "{why}");
    assert!(matches!(
        judge(ahead, &raw(0, Some(&report(2, &["_start"])), line), false).outcome,
        Outcome::Fail(_)
    ));
}

#[test]
fn a_failed_load_reports_the_tracers_last_lines() {
    let stderr = "memtrace-bpf: loading\nverifier log line\n\
                  memtrace-bpf: error: failed to create map INFLIGHT: Invalid argument\n";
    let judged = judge(&CHECKS[2], &raw(1, None, stderr), false);
    assert_eq!(
        judged.outcome,
        Outcome::Fail("exit 1: error: failed to create map INFLIGHT: Invalid argument".into())
    );
    // A verifier log quoted with \n escapes: its reason is at its end.
    let stderr = r"memtrace-bpf: error: verifying BPF program valloc_enter: the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: reg type unsupported for arg#0\n0: R1=ctx() R10=fp0\n12: (71) r1 = *(u8 *)(r2 -20)\ninvalid access to map value, value_size=200 off=-20 size=1\nprocessed 40 insns (limit 1000000)\nverification time 26 usec\n: Permission denied (os error 13)";
    let Outcome::Fail(why) = judge(&CHECKS[0], &raw(1, None, stderr), false).outcome else {
        panic!("a rejected program passes");
    };
    assert!(
        why.starts_with("exit 1: error: verifying BPF program valloc_enter: "),
        "{why}"
    );
    assert!(
        why.ends_with("verifier: … 12: (71) r1 = *(u8 *)(r2 -20) / invalid access to map value, value_size=200 off=-20 size=1"),
        "{why}"
    );
    // Not an error line last: the last two lines.
    let judged = judge(&CHECKS[2], &raw(2, None, "one\ntwo\nthree\n"), false);
    assert_eq!(judged.outcome, Outcome::Fail("exit 2: two / three".into()));
    assert_eq!(judged.mode, None);
    assert_eq!(
        judge(&CHECKS[2], &Raw::default(), true).outcome,
        Outcome::Timeout("(no stderr)".into())
    );
    assert!(matches!(
        judge(&CHECKS[2], &Raw::default(), false).outcome,
        Outcome::Fail(_)
    ));
    assert_eq!(
        judge(&CHECKS[2], &raw(124, None, "processed 402365 insns"), false).outcome,
        Outcome::Timeout("processed 402365 insns".into())
    );
    assert_eq!(
        judge(
            &CHECKS[2],
            &raw(125, None, "skipped: exact-3-sites timed out in this guest"),
            false
        )
        .outcome,
        Outcome::Fail("skipped: exact-3-sites timed out in this guest".into())
    );
}

#[test]
fn sampling_needs_samples_and_the_rust_check_sums_by_calling_site() {
    let sampled = report(1, &[]);
    assert_eq!(
        judge(&CHECKS[2], &raw(0, Some(&sampled), ""), false).outcome,
        Outcome::Pass
    );
    let empty = json!({"frames": [], "stacks": [], "losses": {}});
    assert!(matches!(
        judge(&CHECKS[2], &raw(0, Some(&empty), ""), false).outcome,
        Outcome::Fail(_)
    ));
    // Rust: shims before the site, crate-prefixed names; no completeness.
    let mut rust = report(1, &[]);
    for f in rust["frames"].as_array_mut().expect("frames") {
        let name = f["function"].as_str().expect("name").to_owned();
        if name.starts_with("site_") {
            f["function"] = json!(format!("rjem::{name}"));
        }
    }
    assert_eq!(
        judge(&CHECKS[3], &raw(0, Some(&rust), ""), false).outcome,
        Outcome::Pass
    );
}

#[test]
fn the_cgroup_check_needs_v2_numbers_that_say_the_growth_is_no_heap() {
    let check = CHECKS
        .iter()
        .find(|c| c.name == "cgroup-v2-memory")
        .unwrap();
    assert_eq!(check.name, "cgroup-v2-memory");
    let with =
        |memory: Value| json!({"frames": [], "stacks": [], "losses": {}, "cgroup_memory": memory});
    let v2 = with(
        json!({"source": "cgroup v2", "growth": {"anon_growth_bytes": 60 << 20, "heap_share": 0.0}}),
    );
    assert_eq!(
        judge(check, &raw(0, Some(&v2), ""), false).outcome,
        Outcome::Pass
    );
    for bad in [
        with(
            json!({"source": "cgroup v1", "growth": {"anon_growth_bytes": 60 << 20, "heap_share": 0.0}}),
        ),
        with(
            json!({"source": "cgroup v2", "growth": {"anon_growth_bytes": 1 << 20, "heap_share": null}}),
        ),
        with(
            json!({"source": "cgroup v2", "growth": {"anon_growth_bytes": 60 << 20, "heap_share": 0.9}}),
        ),
        with(Value::Null),
    ] {
        assert!(
            matches!(
                judge(check, &raw(0, Some(&bad), ""), false).outcome,
                Outcome::Fail(_)
            ),
            "{bad}"
        );
    }
}

#[test]
fn verified_counts_in_both_forms() {
    let stderr = "program alloc_return verified in 1,000,001 instructions\n\
                  memtrace-bpf: program free_enter verified in 120 instructions\n\
                  the return program verified in 99 instructions\nverified in nothing\n";
    assert_eq!(
        verified(stderr),
        vec![
            ("alloc_return".into(), 1_000_001),
            ("free_enter".into(), 120),
            ("return".into(), 99)
        ]
    );
}

#[test]
fn the_table_has_a_row_per_check_and_the_largest_program_per_kernel() {
    let stderr = "memtrace-bpf: kernel 6.12: mode: tables\nprogram alloc_return verified in 366578 instructions\nprogram free verified in 20 instructions\n";
    let pass = judge(
        &CHECKS[0],
        &raw(0, Some(&report(1, &["_start"])), stderr),
        false,
    );
    let fail = judge(&CHECKS[1], &raw(1, None, "error: a|b"), false);
    let runs = [
        KernelRun {
            name: "6.12".into(),
            release: "6.12.118+deb13-amd64".into(),
            seconds: 170,
            problem: None,
            checks: vec![pass, fail],
        },
        KernelRun {
            name: "5.10".into(),
            release: "5.10.244-1".into(),
            seconds: 0,
            problem: Some("no image package".into()),
            checks: vec![],
        },
    ];
    assert!(!runs[0].passed() && !runs[1].passed());
    let md = markdown(&runs);
    assert!(
        md.contains("| 6.12 | 6.12.118+deb13-amd64 | exact-3-sites | PASS | mode=tables | 12 |"),
        "{md}"
    );
    assert!(
        md.contains("| pid-attach | FAIL | exit 1: error: a\\|b |"),
        "{md}"
    );
    assert!(
        md.contains("| 5.10 | 5.10.244-1 | boot | FAIL | no image package | |"),
        "{md}"
    );
    assert!(
        md.contains("| 6.12 | 6.12.118+deb13-amd64 | 170 | alloc_return | 366578 |"),
        "{md}"
    );
    let lines = console(&runs[0]);
    assert!(
        lines.contains("6.12    exact-3-sites  PASS  mode=tables"),
        "{lines}"
    );
    assert!(
        lines.contains("largest program alloc_return: 366578 instructions verified"),
        "{lines}"
    );
}

#[test]
fn a_busy_host_gives_a_guest_more_time_up_to_four_times() {
    let limits = (Duration::from_secs(600), Duration::from_secs(180));
    assert_eq!(super::scaled_limits(limits, 0.3), limits);
    assert_eq!(
        super::scaled_limits(limits, 2.5),
        (Duration::from_secs(1500), Duration::from_secs(450))
    );
    assert_eq!(
        super::scaled_limits(limits, 30.0),
        (Duration::from_secs(2400), Duration::from_secs(720))
    );
}
