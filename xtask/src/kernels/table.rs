//! The matrix's results as console lines and as a markdown table.

use std::fmt::Write as _;

use super::judge::{Judged, Outcome};

/// One kernel's run: what booted and what each check gave.
pub struct KernelRun {
    /// The short name (`5.10`, `newest`).
    pub name: String,
    /// `uname -r` in the guest, else the package's version.
    pub release: String,
    /// Boot plus checks, in seconds.
    pub seconds: u64,
    /// Why the guest gave no results at all (no package, boot failure).
    pub problem: Option<String>,
    pub checks: Vec<Judged>,
}

impl KernelRun {
    pub fn passed(&self) -> bool {
        self.problem.is_none()
            && !self.checks.is_empty()
            && self.checks.iter().all(|c| c.outcome == Outcome::Pass)
    }

    /// The program with the most verified instructions over all checks.
    pub fn largest_verified(&self) -> Option<(&str, u64)> {
        self.checks
            .iter()
            .flat_map(|c| &c.verified)
            .max_by_key(|(_, n)| *n)
            .map(|(p, n)| (p.as_str(), *n))
    }
}

fn result(c: &Judged) -> (&'static str, String) {
    let mode = c
        .mode
        .as_deref()
        .map(|m| format!("mode={m}"))
        .unwrap_or_else(|| "mode=(no line)".into());
    match &c.outcome {
        Outcome::Pass => ("PASS", mode),
        Outcome::Fail(why) => ("FAIL", why.clone()),
        Outcome::Timeout(last) => (
            "FAIL",
            format!("timeout after {} s; last: {last}", c.seconds.unwrap_or(0)),
        ),
    }
}

/// One line per kernel and check, then the kernel's largest program.
pub fn console(run: &KernelRun) -> String {
    let mut out = String::new();
    if let Some(problem) = &run.problem {
        let _ = writeln!(out, "{:<7} {:<14} FAIL  {problem}", run.name, "boot");
    }
    for c in &run.checks {
        let (status, detail) = result(c);
        let _ = writeln!(out, "{:<7} {:<14} {status}  {detail}", run.name, c.check);
    }
    let largest = run.largest_verified().map_or_else(
        || "no verifier counts printed".into(),
        |(p, n)| format!("largest program {p}: {n} instructions verified"),
    );
    let _ = writeln!(
        out,
        "{:<7} {} in {} s; {largest}",
        run.name, run.release, run.seconds
    );
    out
}

/// `|` and newlines would break a markdown row.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// The markdown report: one row per kernel and check, then one per kernel.
pub fn markdown(runs: &[KernelRun]) -> String {
    let mut out = String::from("| Kernel | Release | Check | Result | Mode or reason | Seconds |\n|---|---|---|---|---|---|\n");
    for run in runs {
        if let Some(problem) = &run.problem {
            let _ = writeln!(
                out,
                "| {} | {} | boot | FAIL | {} | |",
                run.name,
                cell(&run.release),
                cell(problem)
            );
        }
        for c in &run.checks {
            let (status, detail) = result(c);
            let secs = c.seconds.map(|s| s.to_string()).unwrap_or_default();
            let _ = writeln!(
                out,
                "| {} | {} | {} | {status} | {} | {secs} |",
                run.name,
                cell(&run.release),
                c.check,
                cell(&detail)
            );
        }
    }
    out.push_str("\n| Kernel | Release | Guest seconds | Largest verified program | Instructions |\n|---|---|---|---|---|\n");
    for run in runs {
        let (program, n) = run
            .largest_verified()
            .map_or(("(none printed)".to_owned(), String::new()), |(p, n)| {
                (p.to_owned(), n.to_string())
            });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {n} |",
            run.name,
            cell(&run.release),
            run.seconds,
            cell(&program)
        );
    }
    out
}
