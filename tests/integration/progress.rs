//! The progress line: on a terminal, one stderr line
//! rewritten about once a second with the elapsed time, events per second,
//! live bytes and losses; cleared before other lines and at the end; never
//! when stderr is not a terminal; -q turns it off.
//!
//! The terminal is a real pseudo-terminal: util-linux `script` runs the
//! tracer on one and copies everything written to it.

use std::{path::Path, process::Command};

use crate::harness::{
    compile_c, saved_elsewhere, scratch, sites::O2_FLAGS, Target, Tracer, TRACER,
};

/// What the line is rewritten with: carriage return, erase to the end of
/// the line.
const ERASE: &str = "\r\x1b[K";

/// steady.c allocates and frees all the time: events every second.
fn steady(tag: &str) -> Target {
    let bin = compile_c("steady", tag, O2_FLAGS);
    Target::start(&bin, &[])
}

/// Runs the tracer with `args` on a pseudo-terminal; returns everything it
/// wrote there (stdout and stderr) and whether it succeeded.
fn on_a_terminal(args: &[&str]) -> (bool, String) {
    let mut command = vec![TRACER.to_string()];
    command.extend(args.iter().map(|a| a.to_string()));
    for a in &command {
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.{}".contains(c)),
            "{a:?} would need quoting for script -c"
        );
    }
    let out = Command::new("script")
        .args(["-qfec", &command.join(" "), "/dev/null"])
        // A terminal that understands the erase sequence.
        .env("TERM", "xterm")
        .output()
        .expect("run script (util-linux)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The progress lines drawn, in order: what follows each erase up to the
/// next carriage return, when it is one.
fn progress_lines(output: &str) -> Vec<&str> {
    output
        .split(ERASE)
        .skip(1)
        .map(|s| s.split('\r').next().unwrap_or(""))
        .filter(|s| s.contains(" elapsed, "))
        .collect()
}

/// The rows a terminal shows at the end: each row's text after carriage
/// returns overwrote it and erases cut it.
fn screen(output: &str) -> Vec<String> {
    let mut rows = Vec::new();
    let mut row: Vec<char> = Vec::new();
    let mut cursor = 0;
    let mut rest = output;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("\x1b[K") {
            row.truncate(cursor);
            rest = after;
            continue;
        }
        match c {
            '\r' => cursor = 0,
            '\n' => {
                rows.push(row.iter().collect());
                row.clear();
                cursor = 0;
            }
            c => {
                if cursor < row.len() {
                    row[cursor] = c;
                } else {
                    row.push(c);
                }
                cursor += 1;
            }
        }
        rest = &rest[c.len_utf8()..];
    }
    rows.push(row.into_iter().collect());
    rows
}

/// `memtrace-bpf: M:SS elapsed, N events/s, X live, N lost`: the numbers.
fn fields(line: &str) -> (String, u64, String, u64) {
    fn not_one<T>(line: &str) -> T {
        panic!("not a progress line: {line:?}")
    }
    let bad = || not_one(line);
    let rest = line.strip_prefix("memtrace-bpf: ").unwrap_or_else(bad);
    let parts: Vec<&str> = rest.split(", ").collect();
    let [elapsed, rate, live, lost] = parts[..] else {
        return not_one(line);
    };
    let elapsed = elapsed.strip_suffix(" elapsed").unwrap_or_else(bad);
    let rate = rate.strip_suffix(" events/s").unwrap_or_else(bad);
    let live = live.strip_suffix(" live").unwrap_or_else(bad);
    let lost = lost.strip_suffix(" lost").unwrap_or_else(bad);
    let (m, s) = elapsed.split_once(':').unwrap_or_else(|| not_one(line));
    assert!(
        m.parse::<u64>().is_ok() && s.len() == 2 && s.parse::<u64>().is_ok(),
        "{line:?}"
    );
    let unit = live.split(' ').nth(1).unwrap_or_else(bad);
    assert!(["B", "KiB", "MiB", "GiB"].contains(&unit), "{line:?}");
    (
        elapsed.to_string(),
        rate.parse().unwrap_or_else(|_| not_one(line)),
        live.to_string(),
        lost.parse().unwrap_or_else(|_| not_one(line)),
    )
}

#[test]
fn on_a_terminal_the_progress_line_updates_in_place_and_is_cleared() {
    let target = steady("progress-pty");
    let pid = target.pid().to_string();
    let dir = scratch("progress-pty");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let template = dir.join("heap-{n}.txt");
    let snapshots = template.to_str().expect("utf-8 path");
    // The snapshots' directory disappears during the trace: each later
    // snapshot prints a warning while the progress line is up.
    let remover = {
        let dir = dir.clone();
        std::thread::spawn(move || wait_then_remove(&dir))
    };
    let (ok, output) = on_a_terminal(&[
        "--sample-rate",
        "1",
        "--pid",
        &pid,
        "-d",
        "6",
        "--interval",
        "1",
        "-o",
        snapshots,
    ]);
    remover.join().expect("remover thread");
    let lines = progress_lines(&output);
    let parsed: Vec<_> = lines.iter().map(|l| fields(l)).collect();
    // Updated: several seconds shown, events counted, nothing lost.
    let mut seconds: Vec<&String> = parsed.iter().map(|p| &p.0).collect();
    seconds.dedup();
    assert!(seconds.len() >= 2, "one update only: {lines:?}");
    assert!(parsed.iter().any(|p| p.1 > 0), "no events/s: {lines:?}");
    assert!(parsed.iter().all(|p| p.3 == 0), "losses: {lines:?}");
    // What stays on the screen: every other line whole, no progress left.
    let rows = screen(&output);
    assert!(
        rows.iter().all(|r| !r.contains(" elapsed, ")),
        "a progress line was left on the screen:\n{}",
        rows.join("\n")
    );
    let warnings: Vec<&String> = rows
        .iter()
        .filter(|r| r.contains("snapshot") && r.contains("not written"))
        .collect();
    assert!(!warnings.is_empty(), "no warning:\n{output:?}");
    for w in &warnings {
        assert!(w.starts_with("memtrace-bpf: warning: snapshot "), "{w:?}");
    }
    // The final report could not be written where asked either (its
    // directory is gone): it was saved elsewhere, and the error saying
    // where is the last line, whole.
    assert!(!ok, "{output:?}");
    let last = rows
        .iter()
        .rev()
        .find(|r| !r.is_empty())
        .expect("a last line");
    assert!(
        last.starts_with("memtrace-bpf: error: the report could not be written to ")
            && last.contains("; it was saved to ")
            && last.contains(" instead: -o "),
        "{rows:?}"
    );
    let saved = saved_elsewhere(last);
    assert!(
        std::fs::metadata(saved).is_ok_and(|m| m.len() > 0),
        "{saved}"
    );
    let _ = std::fs::remove_file(saved);
}

/// Removes `dir` once a snapshot has been written there.
fn wait_then_remove(dir: &Path) {
    let first = dir.join("heap-1.txt");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !first.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::fs::remove_dir_all(dir).expect("remove the snapshots' directory");
}

#[test]
fn on_a_terminal_the_final_summary_is_clean_and_quiet_turns_the_line_off() {
    let target = steady("progress-quiet");
    let pid = target.pid().to_string();
    let report = scratch("progress-quiet.txt");
    let report = report.to_str().expect("utf-8 path");
    let (ok, output) = on_a_terminal(&["--pid", &pid, "-d", "3", "-o", report]);
    assert!(ok, "{output:?}");
    assert!(!progress_lines(&output).is_empty(), "{output:?}");
    let summary = "memtrace-bpf: duration elapsed after ";
    let at = output.find(summary).expect("the final summary");
    assert!(output[..at].ends_with(ERASE), "{output:?}");
    assert!(!output[at..].contains(" elapsed, "), "{output:?}");
    let (ok, output) = on_a_terminal(&["-q", "--pid", &pid, "-d", "2", "-o", report]);
    assert!(ok, "{output:?}");
    assert!(output.contains(summary), "{output:?}");
    assert!(
        !output.contains("\x1b[") && !output.contains(" events/s"),
        "-q: {output:?}"
    );
}

#[test]
fn without_a_terminal_there_is_no_progress_line() {
    let target = steady("progress-pipe");
    let pid = target.pid().to_string();
    let report = scratch("progress-pipe.txt");
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "-d",
        "3",
        "-o",
        report.to_str().expect("utf-8 path"),
    ]);
    let out = tracer.finish();
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        out.stderr.contains("duration elapsed after"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\r')
            && !out.stderr.contains('\x1b')
            && !out.stderr.contains("events/s"),
        "{:?}",
        out.stderr
    );
}
