//! `--cgroup PATH`: finding the cgroup v2 hierarchy (from
//! /proc/self/mountinfo), resolving the path given to a cgroup in it (its
//! id and depth, which the BPF filter compares), and listing the processes
//! of its subtree.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
};

use anyhow::bail;

/// statfs f_type of cgroup v2 and of a cgroup v1 hierarchy (linux/magic.h).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

/// Most cgroups `processes` walks under the subtree, and most pids it
/// returns: a subtree is a container or a service, not the whole host;
/// beyond these the rest is found when its processes exec or allocate.
const MAX_CGROUPS_WALKED: usize = 4096;
const MAX_PIDS_LISTED: usize = 65_536;

/// The cgroup v2 hierarchy as this process sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroup2Mount {
    /// Where it is mounted (`/sys/fs/cgroup`, `/sys/fs/cgroup/unified`).
    pub mount: PathBuf,
    /// The cgroup the mount shows as its root, from the hierarchy's root
    /// (`/` unless mounted from inside a cgroup namespace or a bind mount).
    pub root: PathBuf,
}

/// A cgroup v2 to trace: its directory, its path in the hierarchy, and
/// what the BPF filter compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedCgroup {
    /// The directory under the mount.
    pub dir: PathBuf,
    /// Its path from the hierarchy's root (`/system.slice/x.service`), as
    /// /proc/PID/cgroup names it.
    pub path: String,
    /// The cgroup id: its directory's inode number, what
    /// bpf_get_current_cgroup_id() returns (kernfs node id, 64-bit hosts).
    pub id: u64,
    /// Depth below the hierarchy's root (the root is 0).
    pub level: u32,
}

/// The cgroup2 mount, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> anyhow::Result<Cgroup2Mount> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| anyhow::anyhow!("--cgroup: cannot read /proc/self/mountinfo ({e})"))?;
    match parse_mountinfo(&mountinfo) {
        Some(mount) => Ok(mount),
        None => bail!(
            "--cgroup: no cgroup v2 filesystem is mounted (none in /proc/self/mountinfo): mount \
             one with `mount -t cgroup2 none /sys/fs/cgroup/unified`, or trace the processes \
             with --pid or --binary"
        ),
    }
}

/// The first cgroup2 mount in a mountinfo text.
fn parse_mountinfo(text: &str) -> Option<Cgroup2Mount> {
    text.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [TAGS] - TYPE SOURCE SUPER
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|&f| f == "-")?;
        if fields.get(dash + 1) != Some(&"cgroup2") {
            return None;
        }
        Some(Cgroup2Mount {
            root: PathBuf::from(unescape_octal(fields.get(3)?)),
            mount: PathBuf::from(unescape_octal(fields.get(4)?)),
        })
    })
}

/// mountinfo writes space, tab, newline and backslash as `\040` etc.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = bytes.get(i + 1..i + 4).and_then(|d| {
            let d = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(d, 8).ok()
        });
        match (bytes[i], code) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Resolves `given` (a directory under the mount, or a path relative to
/// it, or a hierarchy path such as /proc/PID/cgroup shows) to a cgroup.
pub fn resolve(given: &Path) -> anyhow::Result<TracedCgroup> {
    let mount = cgroup2_mount()?;
    resolve_in(&mount, given)
}

fn resolve_in(m: &Cgroup2Mount, given: &Path) -> anyhow::Result<TracedCgroup> {
    // Raw: the error is escaped once, where main prints it.
    let shown = given.display();
    let mount = m.mount.display();
    // Relative to the mount: `system.slice/x.service` or, as
    // /proc/PID/cgroup prints it, `/system.slice/x.service`.
    let relative: PathBuf = given
        .components()
        .filter(|c| !matches!(c, Component::RootDir))
        .collect();
    let under_mount = m.mount.join(relative);
    let candidate = match given.is_absolute() {
        true if given.starts_with(&m.mount) => given.to_path_buf(),
        true if under_mount.exists() || !given.exists() => under_mount,
        // Elsewhere (a cgroup v1 directory, a file): said below.
        true => given.to_path_buf(),
        false => under_mount,
    };
    let dir = match std::fs::canonicalize(&candidate) {
        Ok(dir) => dir,
        Err(e) => bail!(
            "--cgroup {shown}: no such cgroup ({e}): pass a directory under the cgroup v2 \
             mount {mount}, or a path relative to it (a process's is on the `0::` line of \
             /proc/PID/cgroup)"
        ),
    };
    let fs_type = statfs_type(&dir);
    if fs_type == Some(CGROUP_SUPER_MAGIC) {
        bail!(
            "--cgroup {shown}: a cgroup v1 hierarchy; memtrace-bpf traces cgroup v2 cgroups, \
             mounted at {mount}: pass the cgroup's path there"
        );
    }
    if !dir.is_dir() || fs_type != Some(CGROUP2_SUPER_MAGIC) || !dir.starts_with(&m.mount) {
        bail!(
            "--cgroup {shown}: not a cgroup directory: pass a directory under the cgroup v2 \
             mount {mount}, or a path relative to it"
        );
    }
    let below = dir.strip_prefix(&m.mount).unwrap_or(Path::new(""));
    let in_hierarchy = m.root.join(below);
    let level = in_hierarchy
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let id = std::fs::metadata(&dir)
        .map_err(|e| anyhow::anyhow!("--cgroup {shown}: cannot read the cgroup ({e})"))?
        .ino();
    Ok(TracedCgroup {
        path: in_hierarchy.to_string_lossy().into_owned(),
        dir,
        id,
        level: u32::try_from(level)?,
    })
}

fn statfs_type(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs writes into the zeroed struct; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    (rc == 0).then_some(st.f_type)
}

impl TracedCgroup {
    /// The processes in the subtree now (bounded: see MAX_CGROUPS_WALKED).
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        let mut walked = 0;
        while let Some(dir) = dirs.pop() {
            walked += 1;
            if walked > MAX_CGROUPS_WALKED || pids.len() >= MAX_PIDS_LISTED {
                break;
            }
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            dirs.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        pids.truncate(MAX_PIDS_LISTED);
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_among_v1_ones() {
        let text = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n\
                    35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    41 31 0:38 /sub /sys/fs/cgroup/uni\\040fied rw shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_mountinfo(text),
            Some(Cgroup2Mount {
                mount: PathBuf::from("/sys/fs/cgroup/uni fied"),
                root: PathBuf::from("/sub"),
            })
        );
        assert_eq!(parse_mountinfo("1 2 0:1 / / rw - ext4 /dev/sda rw\n"), None);
        assert_eq!(parse_mountinfo("- cgroup2\n\\\n"), None);
    }

    #[test]
    fn octal_escapes_are_undone_and_broken_ones_kept() {
        assert_eq!(unescape_octal("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape_octal("a\\04"), "a\\04");
        assert_eq!(unescape_octal("a\\999"), "a\\999");
    }
}
