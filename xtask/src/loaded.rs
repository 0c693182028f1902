//! `cargo xtask loaded`: integration tests run again and again while
//! `stress-ng --cpu N` keeps every core busy, the machine users trace on.
//! A test that fails once in a while, or only under load, fails here.

use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, repo_root};

#[derive(clap::Args)]
pub struct LoadedArgs {
    /// Runs of the tests (each one `cargo test --test integration`).
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// stress-ng's CPU workers.
    #[arg(long, default_value_t = 4)]
    cpu: u32,
    /// The tests' name filter, as for `cargo test`.
    filter: String,
}

/// Kills stress-ng when the runs end, also on an error.
struct Load(Child);

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn run(args: &LoadedArgs) -> Result<()> {
    crate::setup::run()?;
    // Built first, unloaded: the runs then only run.
    let status = cargo()
        .current_dir(repo_root())
        .args(["test", "--test", "integration", "--no-run"])
        .status()
        .context("cargo test --no-run")?;
    if !status.success() {
        bail!("the integration tests do not build");
    }
    let _load = Load(
        Command::new("stress-ng")
            .args(["--cpu", &args.cpu.to_string(), "--quiet"])
            .stdout(Stdio::null())
            .spawn()
            .context("start stress-ng (cargo xtask setup installs it)")?,
    );
    for run in 1..=args.runs {
        println!(
            "run {run} of {} under stress-ng --cpu {}",
            args.runs, args.cpu
        );
        let status = test_command(&args.filter).status()?;
        if !status.success() {
            bail!(
                "run {run} of {} failed under stress-ng --cpu {}",
                args.runs,
                args.cpu
            );
        }
    }
    println!(
        "{} runs of `{}` passed under stress-ng --cpu {}",
        args.runs, args.filter, args.cpu
    );
    Ok(())
}

fn test_command(filter: &str) -> Command {
    let mut cmd = cargo();
    cmd.current_dir(repo_root())
        .args(["test", "--test", "integration", "--", filter]);
    cmd
}
