//! `cargo xtask bench`: the cost of tracing, measured as ratios in one run
//! (this machine is noisy; nothing here is a timed assertion).
//!
//! The target (bench/alloc_loop.c, -O2 without frame pointers) times its own
//! malloc/free loop; it runs untraced, traced with `--unwind fp` and traced
//! with `--unwind dwarf`, REPEATS times each, interleaved, and the medians
//! are compared. The tracer's `--verbose` line gives user-space unwinding
//! throughput.

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::cmd::{repo_root, run as run_cmd, target_dir};

const REPEATS: usize = 3;
const PAIRS: &str = "200000";
const TIMEOUT: Duration = Duration::from_secs(120);

struct Mode {
    name: &'static str,
    tracer_args: Option<&'static [&'static str]>,
}

const MODES: &[Mode] = &[
    Mode {
        name: "untraced",
        tracer_args: None,
    },
    Mode {
        name: "fp",
        tracer_args: Some(&["--unwind", "fp"]),
    },
    Mode {
        name: "dwarf",
        tracer_args: Some(&["--unwind", "dwarf"]),
    },
];

#[derive(Default, Clone)]
struct RunResult {
    ns_per_pair: f64,
    stacks_per_sec: Option<f64>,
    recorded: u64,
    lost: u64,
}

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::build_release()?;
    let dir = target_dir().join("bench");
    fs::create_dir_all(&dir)?;
    let bin = dir.join("alloc_loop");
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&bin)
            .arg(repo_root().join("bench/alloc_loop.c")),
    )?;
    let tracer = target_dir().join("release/memtrace-bpf");

    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); MODES.len()];
    for rep in 0..REPEATS {
        for (i, mode) in MODES.iter().enumerate() {
            let r = run_once(&bin, &tracer, mode, &dir)
                .with_context(|| format!("run {rep} of {}", mode.name))?;
            eprintln!(
                "bench: {} run {}: {:.0} ns/pair",
                mode.name,
                rep + 1,
                r.ns_per_pair
            );
            results[i].push(r);
        }
    }
    let med: Vec<RunResult> = results.iter().map(|r| median(r)).collect();
    report(&med, &dir)
}

fn median(runs: &[RunResult]) -> RunResult {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.ns_per_pair.total_cmp(&b.ns_per_pair));
    sorted[sorted.len() / 2].clone()
}

fn report(med: &[RunResult], dir: &Path) -> Result<()> {
    let base = med[0].ns_per_pair;
    println!("\nmalloc/free pairs, one thread, medians of {REPEATS} runs ({PAIRS} pairs each)\n");
    println!(
        "| mode | ns per pair | × untraced | added ns per recorded allocation | recorded | lost |"
    );
    println!("|---|---|---|---|---|---|");
    for (mode, r) in MODES.iter().zip(med) {
        println!(
            "| {} | {:.0} | {:.2} | {} | {} | {} |",
            mode.name,
            r.ns_per_pair,
            r.ns_per_pair / base,
            if mode.tracer_args.is_some() {
                format!("{:.0}", r.ns_per_pair - base)
            } else {
                "-".into()
            },
            r.recorded,
            r.lost
        );
    }
    let (fp, dwarf) = (&med[1], &med[2]);
    println!(
        "\ndwarf vs fp: {:+.0} ns per recorded allocation ({:.2}× the fp cost)",
        dwarf.ns_per_pair - fp.ns_per_pair,
        (dwarf.ns_per_pair - base) / (fp.ns_per_pair - base).max(1.0)
    );
    if let Some(rate) = dwarf.stacks_per_sec {
        println!("user-space DWARF unwinding: {rate:.0} stacks/s on one core");
    }
    let json = format!(
        "{{\"untraced_ns_per_pair\":{:.1},\"fp_ns_per_pair\":{:.1},\"dwarf_ns_per_pair\":{:.1},\"unwind_stacks_per_sec\":{:.0}}}\n",
        base,
        fp.ns_per_pair,
        dwarf.ns_per_pair,
        dwarf.stacks_per_sec.unwrap_or(0.0)
    );
    let path = dir.join("unwind.json");
    fs::write(&path, json)?;
    println!("written to {}", path.display());
    Ok(())
}

fn run_once(bin: &Path, tracer: &Path, mode: &Mode, dir: &Path) -> Result<RunResult> {
    let mut cmd = Command::new(bin);
    cmd.arg(PAIRS);
    let mut target = Proc::spawn(cmd, true)?;
    target.wait_line("ready")?;
    let report_path: PathBuf = dir.join(format!("{}.json", mode.name));
    let mut tracer_proc = match mode.tracer_args {
        None => None,
        Some(args) => {
            let mut cmd = Command::new(tracer);
            cmd.args([
                "--pid",
                &target.child.id().to_string(),
                "-v",
                "--format",
                "json",
                "-o",
            ])
            .arg(&report_path)
            .args(args);
            let mut t = Proc::spawn(cmd, false)?;
            t.wait_line("tracing pid")?;
            Some(t)
        }
    };
    target.send("go\n")?;
    let line = target.wait_line("ns_per_pair")?;
    let ns_per_pair: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected target output {line:?}"))?;
    let mut result = RunResult {
        ns_per_pair,
        ..Default::default()
    };
    if let Some(t) = tracer_proc.as_mut() {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(t.child.id() as libc::pid_t, libc::SIGINT) };
        let status = t.child.wait()?;
        if !status.success() {
            bail!("tracer failed: {}", t.rest().join("\n"));
        }
        let stderr = t.rest();
        result.stacks_per_sec = stderr
            .iter()
            .find(|l| l.contains("stacks/s"))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim_end_matches(" stacks/s").parse().ok());
        let text = fs::read_to_string(&report_path)?;
        result.recorded = json_u64(&text, "\"alloc_objects\"").unwrap_or(0);
        result.lost = ["\"ringbuf_full\"", "\"live_map_full\"", "\"stack_lost\""]
            .iter()
            .filter_map(|k| json_u64(&text, k))
            .sum();
    }
    Ok(result)
}

/// The first integer after `key:` in a JSON text (the report's field names
/// are unique where used here, totals come before stacks).
fn json_u64(text: &str, key: &str) -> Option<u64> {
    let rest = &text[text.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start_matches([':', ' '])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A child whose stdout (target) or stderr (tracer) lines arrive on a channel.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Proc {
    fn spawn(mut cmd: Command, stdout: bool) -> Result<Proc> {
        cmd.stdin(Stdio::piped());
        if stdout {
            cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        } else {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let pipe: Box<dyn std::io::Read + Send> = if stdout {
            Box::new(child.stdout.take().context("stdout")?)
        } else {
            Box::new(child.stderr.take().context("stderr")?)
        };
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok(Proc {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        })
    }

    fn wait_line(&mut self, needle: &str) -> Result<String> {
        loop {
            let line = self
                .lines
                .recv_timeout(TIMEOUT)
                .with_context(|| format!("no line containing {needle:?}"))?;
            if line.contains(needle) {
                return Ok(line);
            }
        }
    }

    fn send(&mut self, s: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("stdin")?;
        stdin.write_all(s.as_bytes())?;
        stdin.flush()?;
        Ok(())
    }

    fn rest(&mut self) -> Vec<String> {
        self.lines.try_iter().collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
