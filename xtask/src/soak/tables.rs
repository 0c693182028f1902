//! The unwind tables' soak: a system-wide trace of every
//! process (default sampling, `--unwind tables`), while a loop starts
//! short processes of four programs in turn (python3.11 -c pass, cc -c
//! on a small C file, rg over the docs, `rustc -V`: 150 MiB of
//! librustc_driver, 1.1 M rows), each mapping its own files and libc.
//! Passes when the tracer's RSS is flat after the first WARMUP processes,
//! and when the rows of tables in use and the trie entries come back to
//! where they were before the loop once it has ended (a process's entries
//! go at its exit; a file's table is kept unused after its last process,
//! within the rows' capacity). Prints what the tables cost per file and
//! per process, and how many were built.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::atomic::Ordering,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    monitor::{Monitor, Series, StatsLine, Tables},
    rss_verdict, system_wide_lock, SoakArgs, Verdict, PYTHON, WARMUP,
};
use crate::cmd::{repo_root, target_dir};

const RG: &str = "/usr/bin/rg";

pub fn soak(args: &SoakArgs, bin: &Path) -> Result<Verdict> {
    let name = "tables";
    for tool in [PYTHON, RG] {
        if !Path::new(tool).exists() {
            bail!(
                "{tool} is missing: the tables soak runs it (apt-get install python3.11 ripgrep)"
            );
        }
    }
    let _lock = system_wide_lock()?;
    let monitor = Monitor::start(bin, name, &[], &args.tracer_args, args.every)?;
    // The baseline: a stats line (every 10 s) before the loop starts.
    thread::sleep(Duration::from_secs(12));
    let started = Instant::now();
    let object = target_dir().join("soak/tables_soak.o");
    let rustc = rustc_binary()?;
    let mut runs = 0u64;
    while started.elapsed().as_secs() < args.seconds {
        let mut cmd = match runs % 4 {
            0 => {
                let mut c = Command::new(PYTHON);
                c.args(["-c", "pass"]);
                c
            }
            1 => {
                let mut c = Command::new("cc");
                c.args(["-O2", "-c", "-o"])
                    .arg(&object)
                    .arg(repo_root().join("bench/alloc_loop.c"));
                c
            }
            2 => {
                let mut c = Command::new(RG);
                c.args(["-c", "the"]).arg(repo_root().join("docs"));
                c
            }
            _ => {
                let mut c = Command::new(&rustc);
                c.arg("-V");
                c
            }
        };
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("running {cmd:?}"))?;
        if !status.success() {
            bail!("{cmd:?} failed ({status})");
        }
        runs += 1;
        monitor.progress.store(runs, Ordering::Relaxed);
    }
    let secs = started.elapsed().as_secs_f64();
    // A stats line after the last process has gone.
    thread::sleep(Duration::from_secs(12));
    let series = monitor.stop()?;
    let _ = std::fs::remove_file(&object);
    let mut v = Verdict::default();
    v.say(format!(
        "soak {name}: {runs} runs of python3.11 -c pass, cc -c, rg -c, rustc -V in {secs:.0} s, \
         every process traced; load average {}",
        series.load_summary()
    ));
    rss_verdict(
        &mut v,
        name,
        &series,
        args,
        |s| s.progress >= WARMUP,
        "after 25 processes",
    );
    tables_verdict(&mut v, name, &series, args);
    if let Some(summary) = &series.tables_summary {
        v.say(format!(
            "soak {name}: final --verbose: unwind tables: {summary}"
        ));
    }
    Ok(v)
}

/// The toolchain's own rustc (not rustup's proxy, which would exec it):
/// it maps librustc_driver, the largest library on a Rust developer's
/// host.
fn rustc_binary() -> Result<std::path::PathBuf> {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .context("running rustc --print sysroot")?;
    let sysroot = String::from_utf8(out.stdout).context("rustc's sysroot is not UTF-8")?;
    let rustc = Path::new(sysroot.trim()).join("bin/rustc");
    if !rustc.exists() {
        bail!("{} is missing: the tables soak runs it", rustc.display());
    }
    Ok(rustc)
}

/// Rows and trie entries before the loop, at their peak, and after it.
fn tables_verdict(v: &mut Verdict, name: &str, series: &Series, args: &SoakArgs) {
    let lines: Vec<(&StatsLine, Tables)> = series
        .stats
        .iter()
        .filter_map(|s| Some((s, s.tables?)))
        .collect();
    let (Some(&(_, base)), Some(&(_, end))) = (
        lines.iter().find(|(s, _)| s.progress == 0),
        lines.last().filter(|(s, _)| s.progress > 0),
    ) else {
        v.check(
            false,
            format!("soak {name}: no stats line with unwind tables before and after the loop"),
        );
        return;
    };
    let peak = lines
        .iter()
        .map(|(_, t)| *t)
        .max_by_key(|t| t.rows)
        .unwrap_or(base);
    let say = |t: Tables| {
        let trie = t
            .trie_bytes
            .map(|b| format!(", trie {:.1} KiB", b as f64 / 1024.0))
            .unwrap_or_default();
        format!(
            "{} files {} rows ({:.1} MiB; kept unused: {} files {} rows), {} mappings of {} \
             processes{trie}",
            t.files,
            t.rows,
            t.rows as f64 * 8.0 / (1024.0 * 1024.0),
            t.kept_files,
            t.kept_rows,
            t.mappings,
            t.processes
        )
    };
    v.say(format!(
        "soak {name}: unwind tables before the loop: {}; at most: {}; after: {}",
        say(base),
        say(peak),
        say(end)
    ));
    let per = |a: u64, b: u64| a as f64 / b.max(1) as f64;
    v.say(format!(
        "soak {name}: per file {:.0} rows ({:.0} KiB); per process {:.1} trie entries{}",
        per(peak.rows, peak.files),
        per(peak.rows * 8, peak.files * 1024),
        per(peak.mappings, peak.processes),
        peak.trie_bytes
            .map(|b| format!(" ({:.0} bytes each)", per(b, peak.mappings)))
            .unwrap_or_default()
    ));
    let in_use = |t: Tables| t.rows.saturating_sub(t.kept_rows);
    // Processes that started during the loop and still run (a shell, a
    // build on the same host) keep their tables in use: the bound grows
    // by max_rows_growth for each process described beyond the baseline.
    let still_running = end.processes.saturating_sub(base.processes).max(1);
    let rows_bound = args.max_rows_growth * still_running;
    v.check(
        in_use(end) <= in_use(base) + rows_bound,
        format!(
            "soak {name}: rows of tables in use after the loop {} against {} before (bound +{} \
             for {} process(es) described beyond the baseline); {} more kept unused",
            in_use(end),
            in_use(base),
            rows_bound,
            still_running,
            end.kept_rows
        ),
    );
    v.check(
        end.mappings <= base.mappings + args.max_mappings_growth,
        format!(
            "soak {name}: trie entries after the loop {} against {} before (bound +{})",
            end.mappings, base.mappings, args.max_mappings_growth
        ),
    );
}
