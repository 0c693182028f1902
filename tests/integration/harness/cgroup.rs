//! A memory cgroup made for one test and removed after it: cgroup v2
//! (`memory.max`) where the v2 hierarchy has the memory controller, else
//! the v1 memory hierarchy (`memory.limit_in_bytes`), as on hybrid hosts.
//! Both are found in /proc/self/mountinfo.

use std::path::{Path, PathBuf};

pub struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// A new child cgroup named after `tag` whose processes may use at
    /// most `limit` bytes, without swap.
    pub fn new(tag: &str, limit: u64) -> MemoryCgroup {
        let (root, v2) = memory_root();
        let dir = root.join(format!("memtrace-test-{tag}-{}", std::process::id()));
        // Left over by an earlier run killed before its Drop.
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create the cgroup {}: {e}", dir.display()));
        let cgroup = MemoryCgroup { dir };
        match v2 {
            true => {
                cgroup.write("memory.max", &limit.to_string());
                // Swap would make the OOM kill slow to come.
                if cgroup.dir.join("memory.swap.max").exists() {
                    cgroup.write("memory.swap.max", "0");
                }
            }
            false => {
                cgroup.write("memory.limit_in_bytes", &limit.to_string());
                // Best effort: v1 refuses it under some hierarchies.
                let _ = std::fs::write(cgroup.dir.join("memory.swappiness"), "0");
            }
        }
        cgroup
    }

    /// The file a process writes its pid into to join the cgroup.
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn write(&self, file: &str, value: &str) {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .unwrap_or_else(|e| panic!("write {value} to {}: {e}", path.display()));
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty by now: its one process was killed and reaped.
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove {}: {e}", self.dir.display());
        }
    }
}

/// The hierarchy with the memory controller, and whether it is cgroup v2.
fn memory_root() -> (PathBuf, bool) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    let mut v1 = None;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS] - TYPE SOURCE SUPER_OPTIONS
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|&f| f == "-") else {
            continue;
        };
        let (Some(mount), Some(fstype)) = (fields.get(4), fields.get(dash + 1)) else {
            continue;
        };
        let mount = Path::new(mount);
        match *fstype {
            "cgroup2" => {
                let controllers =
                    std::fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
                if controllers.split_whitespace().any(|c| c == "memory") {
                    return (mount.to_path_buf(), true);
                }
            }
            "cgroup" => {
                let options = fields.get(dash + 3).copied().unwrap_or("");
                if options.split(',').any(|o| o == "memory") {
                    v1 = Some(mount.to_path_buf());
                }
            }
            _ => {}
        }
    }
    let root = v1.expect("no cgroup hierarchy with the memory controller in /proc/self/mountinfo");
    (root, false)
}
