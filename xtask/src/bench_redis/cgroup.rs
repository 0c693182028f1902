//! A scratch cgroup v2 for the `--cgroup` mode: made under the cgroup2
//! mount (found in /proc/self/mountinfo: `/sys/fs/cgroup/unified` on hybrid
//! hosts, `/sys/fs/cgroup` on most), removed on drop once empty.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

pub(super) struct Cgroup {
    dir: PathBuf,
    /// Its path below the mount, as `--cgroup` takes it.
    pub(super) path: String,
}

impl Cgroup {
    pub(super) fn new() -> Result<Cgroup> {
        let mount = v2_mount()?;
        let name = format!("memtrace-bench-redis-{}", std::process::id());
        let dir = mount.join(&name);
        // Left over by a run killed before its drop (empty: its redis died).
        let _ = fs::remove_dir(&dir);
        fs::create_dir(&dir).with_context(|| format!("creating the cgroup {}", dir.display()))?;
        Ok(Cgroup {
            dir,
            path: format!("/{name}"),
        })
    }

    /// Moves process `pid` in; done when this returns.
    pub(super) fn add(&self, pid: u32) -> Result<()> {
        let procs = self.dir.join("cgroup.procs");
        fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving pid {pid} into {}", procs.display()))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its one process (redis-server) is killed and reaped by now.
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("bench-redis: could not remove {}: {e}", self.dir.display());
        }
    }
}

fn v2_mount() -> Result<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS] - TYPE SOURCE ...
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|&f| f == "-") else {
            continue;
        };
        if fields.get(dash + 1) == Some(&"cgroup2") {
            if let Some(mount) = fields.get(4) {
                return Ok(Path::new(mount).to_path_buf());
            }
        }
    }
    bail!("no cgroup2 mount in /proc/self/mountinfo: the --cgroup mode needs cgroup v2")
}
