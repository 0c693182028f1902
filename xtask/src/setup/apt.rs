//! apt-get for `cargo xtask setup`.

use std::process::Command;

use anyhow::{bail, Result};

use super::first_line;
use crate::cmd::{is_root, output, run as run_cmd};

/// apt-get, with `apt-get update` run at most once per setup.
#[derive(Default)]
pub(super) struct Apt {
    updated: bool,
}

impl Apt {
    pub(super) fn ensure(&mut self, packages: &[&str]) -> Result<()> {
        let missing: Vec<&str> = packages
            .iter()
            .copied()
            .filter(|p| !dpkg_installed(p))
            .collect();
        if missing.is_empty() {
            println!("ok: {}", packages.join(", "));
            return Ok(());
        }
        println!("installing: {} (apt-get)", missing.join(", "));
        if !self.updated {
            run_cmd(&mut self.apt_get(&missing, &["update"])?)?;
            self.updated = true;
        }
        let mut args = vec!["install", "-y"];
        args.extend(&missing);
        run_cmd(&mut self.apt_get(&missing, &args)?)
    }

    /// `apt-get ARGS` as root, via sudo otherwise.
    fn apt_get(&self, missing: &[&str], args: &[&str]) -> Result<Command> {
        // No prompts: CI runs without a terminal on stdin.
        const NONINTERACTIVE: &str = "DEBIAN_FRONTEND=noninteractive";
        if is_root() {
            let mut cmd = Command::new("apt-get");
            cmd.env("DEBIAN_FRONTEND", "noninteractive").args(args);
            return Ok(cmd);
        }
        if first_line("sudo", "--version").is_none() {
            bail!(
                "need the apt packages {0} but not root and `sudo` is not installed; \
                 as root, run: apt-get update && apt-get install -y {0}",
                missing.join(" ")
            );
        }
        let mut cmd = Command::new("sudo");
        cmd.args([NONINTERACTIVE, "apt-get"]).args(args);
        Ok(cmd)
    }
}

fn dpkg_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|s| s.trim() == "install ok installed")
}
