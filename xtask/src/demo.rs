//! `cargo xtask demo`: trace demo/leaky.c with the release binary, print the
//! text report, write a flamegraph, then rank its stacks by growth over a
//! 20 s history and diff two of its snapshots.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::cmd::{repo_root, run as run_cmd, target_dir};

/// How long the demo may take to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::build_release()?;

    let target = target_dir();
    let demo_dir = target.join("demo");
    fs::create_dir_all(&demo_dir)
        .with_context(|| format!("could not create {}", demo_dir.display()))?;
    let leaky = demo_dir.join("leaky");
    // Built the way distributions build: optimized, no frame pointers. The
    // tracer's DWARF unwinding still gives complete stacks, through glibc.
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
            .arg(&leaky)
            .arg(repo_root().join("demo/leaky.c")),
    )?;

    let demo = Demo::start(&leaky)?;
    let pid = demo.pid.to_string();
    let tracer = target.join("release/memtrace-bpf");

    println!("tracing {} (pid {pid}) for 5 s", leaky.display());
    // The demo allocates a few times per 100 ms: cheap enough to record
    // every allocation, so its numbers are exact (the default samples).
    run_cmd(Command::new(&tracer).args(["--pid", &pid, "--duration", "5", "--sample-rate", "1"]))?;

    let svg = demo_dir.join("heap.svg");
    println!("tracing pid {pid} for 3 s more for a flamegraph");
    run_cmd(
        Command::new(&tracer)
            .args([
                "--pid",
                &pid,
                "--duration",
                "3",
                "--sample-rate",
                "1",
                "--format",
                "flamegraph",
                "-o",
            ])
            .arg(&svg),
    )?;
    println!("flamegraph: {}", svg.display());

    // Leak hunting over time: a history every 2 s, stacks ranked by how
    // fast they grow, each with its trend; two of the snapshots diffed.
    let snapshots = demo_dir.join("heap-{n}.json");
    println!("tracing pid {pid} for 20 s more with --interval 2: which stacks grow");
    run_cmd(
        Command::new(&tracer)
            .args([
                "--pid",
                &pid,
                "--duration",
                "20",
                "--interval",
                "2",
                "--sample-rate",
                "1",
                "--format",
                "json",
                "-o",
            ])
            .arg(&snapshots),
    )?;
    // Ticks at 2, 4, ... 18 s, then the final report: number 10.
    let numbered = |n: u32| demo_dir.join(format!("heap-{n}.json"));
    run_cmd(
        Command::new(&tracer)
            .args(["report", "--top", "4"])
            .arg(numbered(10)),
    )?;
    println!("what grew between the snapshots at 2 s and at 18 s:");
    run_cmd(
        Command::new(&tracer)
            .args(["diff", "--top", "4"])
            .arg(numbered(1))
            .arg(numbered(9)),
    )?;
    println!(
        "snapshots: {} (see README, \"Finding a leak\")",
        demo_dir.join("heap-N.json").display()
    );
    Ok(())
}

/// The running demo program; killed when dropped, on success and on error.
struct Demo {
    child: Child,
    pid: u32,
}

impl Demo {
    fn start(program: &Path) -> Result<Self> {
        let mut child = Command::new(program)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("could not start {}", program.display()))?;
        let stdout = child.stdout.take().context("demo stdout was not piped")?;
        let demo = Demo {
            pid: child.id(),
            child,
        };

        // A thread reads stdout so that waiting for "ready" can time out; it
        // keeps draining until the program exits.
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // The receiver is gone after "ready"; keep draining anyway.
                let _ = tx.send(line);
            }
        });
        loop {
            match rx.recv_timeout(READY_TIMEOUT) {
                Ok(line) if line.starts_with("ready") => break,
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("{} did not print its ready line", program.display())
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("{} exited before it was ready", program.display())
                }
            }
        }
        Ok(demo)
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        // Errors mean it has already exited, which is what we want.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
