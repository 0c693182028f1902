//! Judging one check from the raw results a guest left: the tracer's exit
//! status, its stderr and its JSON report. Pure, so it is unit-tested.

use std::collections::BTreeMap;

use serde_json::Value;

/// What a check's report must show.
pub enum Expect {
    /// Exact numbers for the three sites (both threads); `by_caller`: sum
    /// by the first `site_*` frame (Rust's allocation shims stand before
    /// it), else by the leaf; `complete`: every site's stack reaches main
    /// (or the thread's start routine) and beyond.
    Exact { by_caller: bool, complete: bool },
    /// Default sampling: some allocations recorded, no loss.
    Samples,
    /// As `Exact` (complete stacks, by leaf), run by the agent's standby
    /// tracer: programs loaded ahead, their settings in a map, which the
    /// stderr's mode line must say.
    LoadedAhead,
    /// --cgroup on a cgroup v2 with the memory controller: the cgroup's
    /// memory read from its own files, and its growth through mmap said
    /// to be no heap.
    CgroupV2Memory,
}

pub struct Check {
    pub name: &'static str,
    pub expect: Expect,
}

/// In the order tests/guest.sh runs them.
pub const CHECKS: &[Check] = &[
    Check {
        name: "exact-3-sites",
        expect: Expect::Exact {
            by_caller: false,
            complete: true,
        },
    },
    Check {
        name: "pid-attach",
        expect: Expect::Exact {
            by_caller: false,
            complete: true,
        },
    },
    Check {
        name: "sampling",
        expect: Expect::Samples,
    },
    Check {
        name: "rust-jemalloc",
        expect: Expect::Exact {
            by_caller: true,
            complete: false,
        },
    },
    Check {
        name: "loaded-ahead",
        expect: Expect::LoadedAhead,
    },
    Check {
        name: "cgroup-v2-memory",
        expect: Expect::CgroupV2Memory,
    },
];

/// What the mode line says of programs loaded ahead.
const LOADED_AHEAD: &str = "loaded ahead (settings in a map)";

/// [in-use bytes, in-use objects, allocated bytes, allocated objects] per
/// thread of the three sites that tests/targets/sites.c and
/// tests/targets/rjem share (malloc, calloc, realloc chains).
pub const SITES: &[(&str, [u64; 4])] = &[
    ("site_malloc", [10_000, 10, 10_000, 10]),
    ("site_calloc", [2_100, 7, 2_100, 7]),
    (
        "site_realloc",
        [5 * 4096, 5, 5 * (16 + 64 + 256 + 4096), 20],
    ),
];
/// Both targets run every site in the main thread and one worker.
const THREADS: u64 = 2;
/// Loss counters that must stay 0 (as in the integration tests).
const LOSSES: &[&str] = &[
    "ringbuf_full",
    "live_map_full",
    "stack_lost",
    "inflight_full",
    "read_failed",
];

/// What a guest left for one check; `exit` is None when it never ended.
#[derive(Default)]
pub struct Raw {
    pub exit: Option<i32>,
    pub stderr: String,
    pub report: Option<String>,
    pub seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    /// With the tracer's last words, if any.
    Timeout(String),
}

#[derive(Debug, Clone)]
pub struct Judged {
    pub check: &'static str,
    pub outcome: Outcome,
    pub mode: Option<String>,
    /// (program, verified instructions) from `--verbose`.
    pub verified: Vec<(String, u64)>,
    pub seconds: Option<u64>,
}

/// `guest_timed_out`: the guest was killed, so a check without an exit
/// status is a timeout rather than a check that never ran.
pub fn judge(check: &Check, raw: &Raw, guest_timed_out: bool) -> Judged {
    let outcome = match raw.exit {
        None if guest_timed_out => Outcome::Timeout(last_lines(&raw.stderr)),
        None => Outcome::Fail("no result: the guest did not run it".into()),
        // timeout(1)'s status: the check outlived its limit in the guest.
        Some(124) => Outcome::Timeout(last_lines(&raw.stderr)),
        // guest.sh: an earlier check timed out, this one did not run.
        Some(125) => Outcome::Fail(last_lines(&raw.stderr)),
        Some(0) => match raw.report.as_deref().map(serde_json::from_str::<Value>) {
            None => Outcome::Fail(format!("exit 0 but no report; {}", last_lines(&raw.stderr))),
            Some(Err(e)) => Outcome::Fail(format!("report is not JSON: {e}")),
            Some(Ok(report)) => judge_report(&check.expect, &report)
                .or_else(|| not_ahead(&check.expect, &raw.stderr))
                .map_or(Outcome::Pass, Outcome::Fail),
        },
        Some(code) => Outcome::Fail(format!("exit {code}: {}", last_lines(&raw.stderr))),
    };
    Judged {
        check: check.name,
        outcome,
        mode: mode_line(&raw.stderr),
        verified: verified(&raw.stderr),
        seconds: raw.seconds,
    }
}

/// Why a check of programs loaded ahead was not run by them.
fn not_ahead(expect: &Expect, stderr: &str) -> Option<String> {
    let wanted = matches!(expect, Expect::LoadedAhead);
    let said = stderr
        .lines()
        .any(|l| l.contains(": mode: ") && l.contains(LOADED_AHEAD));
    (wanted && !said)
        .then(|| "the programs were not the ones loaded ahead (no such mode line)".into())
}

/// None when the report shows what `expect` asks, else why not.
fn judge_report(expect: &Expect, report: &Value) -> Option<String> {
    let losses: Vec<String> = LOSSES
        .iter()
        .filter(|k| report["losses"][**k].as_u64().unwrap_or(0) != 0)
        .map(|k| format!("{k}={}", report["losses"][*k]))
        .collect();
    if !losses.is_empty() {
        return Some(format!("losses: {}", losses.join(", ")));
    }
    let stacks = stacks(report);
    match expect {
        Expect::CgroupV2Memory => cgroup_memory(&report["cgroup_memory"]),
        Expect::Samples => {
            let samples: u64 = stacks.iter().map(|s| s.counts[3]).sum();
            (samples == 0).then(|| format!("no samples in {} stacks", stacks.len()))
        }
        Expect::LoadedAhead => judge_report(
            &Expect::Exact {
                by_caller: false,
                complete: true,
            },
            report,
        ),
        Expect::Exact {
            by_caller,
            complete,
        } => {
            if report["sample_rate"] != 1 {
                return Some(format!(
                    "sample_rate {} in the report, not 1",
                    report["sample_rate"]
                ));
            }
            exact_sites(&stacks, *by_caller)
                .or_else(|| complete.then(|| incomplete(&stacks)).flatten())
        }
    }
}

/// rss_growth.c maps 20 MiB/s by its own clock: a 3-second trace sees
/// well over 8 MiB of anonymous growth, none of it heap.
fn cgroup_memory(memory: &Value) -> Option<String> {
    if memory["source"] != "cgroup v2" {
        return Some(format!("cgroup_memory: {memory}"));
    }
    let growth = &memory["growth"];
    let anon = growth["anon_growth_bytes"].as_i64().unwrap_or(0);
    let share = growth["heap_share"].as_f64();
    (anon < 8 << 20 || !share.is_some_and(|s| s < 0.1))
        .then(|| format!("cgroup_memory's growth: {growth}"))
}

fn exact_sites(stacks: &[Stack], by_caller: bool) -> Option<String> {
    let mut sums: BTreeMap<&str, [u64; 4]> = BTreeMap::new();
    for s in stacks {
        let site = if by_caller {
            s.names
                .iter()
                .map(|f| f.rsplit("::").next().unwrap_or(f))
                .find(|f| f.starts_with("site_"))
        } else {
            s.names.first().map(String::as_str)
        };
        if let Some(site) = site {
            let e = sums.entry(site).or_default();
            (0..4).for_each(|i| e[i] += s.counts[i]);
        }
    }
    let wrong: Vec<String> = SITES
        .iter()
        .filter_map(|(site, per_thread)| {
            let want = per_thread.map(|v| v * THREADS);
            let got = sums.get(site).copied().unwrap_or_default();
            (got != want).then(|| format!("{site} {got:?} != {want:?}"))
        })
        .collect();
    (!wrong.is_empty()).then(|| format!("[inuse B, objs, alloc B, objs]: {}", wrong.join("; ")))
}

/// The integration tests' completeness (site, run_sites, main or worker,
/// not truncated), plus at least one frame beyond: the unwinder got past
/// main into libc's start code.
fn incomplete(stacks: &[Stack]) -> Option<String> {
    let site_stacks = stacks
        .iter()
        .filter(|s| s.names.first().is_some_and(|n| n.starts_with("site_")));
    site_stacks
        .filter(|s| {
            let n = &s.names;
            s.truncated
                || n.len() < 4
                || n[1] != "run_sites"
                || (n[2] != "main" && n[2] != "worker")
        })
        .map(|s| {
            format!(
                "incomplete stack{}: {}",
                if s.truncated { " (truncated)" } else { "" },
                s.names.join(" < ")
            )
        })
        .next()
}

struct Stack {
    names: Vec<String>,
    counts: [u64; 4],
    truncated: bool,
}

/// The report's stacks with function names (frames are indices into the
/// top-level `frames` table).
fn stacks(report: &Value) -> Vec<Stack> {
    let table = report["frames"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let name = |ix: &Value| -> String {
        let frame = ix
            .as_u64()
            .and_then(|i| table.get(usize::try_from(i).ok()?));
        frame
            .and_then(|f| f["function"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    let fields = [
        "inuse_bytes",
        "inuse_objects",
        "alloc_bytes",
        "alloc_objects",
    ];
    report["stacks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| Stack {
            names: s["frames"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(name)
                .collect(),
            counts: fields.map(|f| s[f].as_u64().unwrap_or(0)),
            truncated: s["truncated"].as_bool().unwrap_or(false),
        })
        .collect()
}

/// The tracer's last words, shortened for one line of the table: its
/// error line alone when the last line is one, else its last two lines.
pub fn last_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let take = if lines.last().is_some_and(|l| l.contains("error")) {
        1
    } else {
        2
    };
    let tail = lines[lines.len().saturating_sub(take)..].join(" / ");
    let tail = verifier_end(&tail.replace("memtrace-bpf: ", ""));
    if tail.is_empty() {
        return "(no stderr)".into();
    }
    shorten(&tail, 300)
}

/// A verifier log quoted in an error message (with `\n` escapes) gives
/// its reason at its end: keep the message's head and the log's last lines.
fn verifier_end(text: &str) -> String {
    let Some((head, log)) = text.split_once("Verifier output:") else {
        return text.to_owned();
    };
    // Its closing statistics and the quoted errno are not the reason.
    let log: Vec<&str> = log
        .split("\\n")
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(':'))
        .filter(|l| {
            ![
                "processed ",
                "verification time",
                "stack depth",
                "insns processed",
            ]
            .iter()
            .any(|s| l.starts_with(s))
        })
        .collect();
    let end = log[log.len().saturating_sub(2)..].join(" / ");
    format!(
        "{}verifier: … {end}",
        shorten(head.trim_end(), 120)
            .trim_end_matches('.')
            .to_owned()
            + ". "
    )
}

pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// What the tracer's mode line (`kernel RELEASE: mode: WORDS`) says
/// after `mode: `.
pub fn mode_line(stderr: &str) -> Option<String> {
    let (_, words) = stderr.lines().find_map(|l| l.split_once(": mode: "))?;
    Some(shorten(words.trim(), 100))
}

/// Every `program NAME verified in N instructions`, and the older form
/// `the NAME program verified in N instructions`.
pub fn verified(stderr: &str) -> Vec<(String, u64)> {
    stderr
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" verified in ")?;
            let count: String = after
                .split_whitespace()
                .next()?
                .chars()
                .filter(|c| *c != ',')
                .collect();
            if !after.split_whitespace().nth(1)?.starts_with("instruction") {
                return None;
            }
            let words: Vec<&str> = before.split_whitespace().collect();
            let name = match words.as_slice() {
                [.., name, "program"] => name,
                [.., "program", name] => name,
                _ => return None,
            };
            Some(((*name).to_owned(), count.parse().ok()?))
        })
        .collect()
}
