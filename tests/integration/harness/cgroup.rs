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

    /// Whether it is a cgroup v2 (else the v1 memory hierarchy's).
    pub fn is_v2() -> bool {
        memory_root().1
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

/// A cgroup v2 made for one test under the cgroup2 mount, removed when
/// dropped, even when the test failed: processes still in it (or in
/// cgroups made below it) are moved to the hierarchy's root first.
pub struct V2Cgroup {
    dir: PathBuf,
    mount: PathBuf,
}

impl V2Cgroup {
    /// `memtrace-test-TAG-PID` at the top of the hierarchy.
    pub fn new(tag: &str) -> V2Cgroup {
        let mount = v2_mount();
        let dir = mount.join(format!("memtrace-test-{tag}-{}", std::process::id()));
        // Left over by an earlier run killed before its Drop.
        remove_tree(&mount, &dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create the cgroup {}: {e}", dir.display()));
        V2Cgroup { dir, mount }
    }

    /// A cgroup below this one, removed on its own drop (or this one's).
    pub fn child(&self, name: &str) -> V2Cgroup {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("create the cgroup {}: {e}", dir.display()));
        V2Cgroup {
            dir,
            mount: self.mount.clone(),
        }
    }

    /// Its directory under the mount.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its path in the hierarchy, as /proc/PID/cgroup shows it.
    pub fn path(&self) -> String {
        let below = self.dir.strip_prefix(&self.mount).expect("under the mount");
        format!("/{}", below.display())
    }

    /// Moves process `pid` into it; done when this returns.
    pub fn add(&self, pid: u32) {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .unwrap_or_else(|e| panic!("move pid {pid} into {}: {e}", procs.display()));
    }
}

impl Drop for V2Cgroup {
    fn drop(&mut self) {
        remove_tree(&self.mount, &self.dir);
    }
}

/// Removes cgroup `dir` and those below it, moving any process left in
/// them to the root cgroup (`mount`).
fn remove_tree(mount: &Path, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(mount, &entry.path());
        }
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines() {
        let _ = std::fs::write(mount.join("cgroup.procs"), pid);
    }
    // A process killed just before (a target dropped) is still exiting in
    // it: the kernel says when the cgroup is empty (`populated 0`). Bounded:
    // a teardown must not hang a failing test.
    for _ in 0..500 {
        let events = std::fs::read_to_string(dir.join("cgroup.events")).unwrap_or_default();
        if !events.lines().any(|l| l == "populated 1") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        eprintln!("could not remove {}: {e}", dir.display());
    }
}

/// The cgroup2 mount point, from /proc/self/mountinfo.
pub fn v2_mount() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    mountinfo
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|&f| f == "-")?;
            (fields.get(dash + 1) == Some(&"cgroup2")).then(|| PathBuf::from(fields[4]))
        })
        .expect("no cgroup2 mount in /proc/self/mountinfo")
}

/// A cgroup v1 hierarchy's mount point, if the host has one.
pub fn v1_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|&f| f == "-")?;
        (fields.get(dash + 1) == Some(&"cgroup")).then(|| PathBuf::from(fields[4]))
    })
}
