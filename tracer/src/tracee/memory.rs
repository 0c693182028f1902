//! What the kernel counts of a process's or a cgroup's memory: resident,
//! anonymous, file-backed and swapped-out bytes, read from the process's
//! /proc/PID/status, and from a cgroup's `memory.stat` (v2, or the v1
//! memory hierarchy's counterpart of the same path). The kernel writes
//! these files: they are still read bounded and parsed without trust.
//!
//! status, not smaps_rollup: its RSS counters are the mm's own (exact since
//! Linux 6.2, before that batched by up to 64 pages per thread), read in
//! 0.02 ms, where smaps_rollup walks the page tables (60 ms for a 1 GiB
//! process here: 64 such processes would take 4 s a round).

use std::{
    io::Read as _,
    path::{Path, PathBuf},
};

/// Longest file read: status is about 1.5 KiB, a v2 memory.stat 2 KiB.
const MAX_FILE: u64 = 16 << 10;

/// Memory the kernel counts, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Resident: a process's RSS; a cgroup's charged memory
    /// (`memory.current`, v1 `memory.usage_in_bytes`), kernel memory included.
    pub resident: u64,
    /// Anonymous memory resident (the heap lives here, with stacks and
    /// anonymous mappings).
    pub anon: u64,
    /// File-backed and shared memory resident (a process: RssFile and
    /// RssShmem; a cgroup: its page cache).
    pub file: u64,
    /// Anonymous memory swapped out.
    pub swap: u64,
}

impl MemoryUse {
    /// Anonymous memory, resident or swapped out: what a heap's growth
    /// shows as.
    pub fn anon_total(&self) -> u64 {
        self.anon.saturating_add(self.swap)
    }
}

/// A process's memory now; None once it has exited (or for a kernel
/// thread, which has no memory of its own).
pub fn of_process(pid: u32) -> Option<MemoryUse> {
    parse_status(&read_bounded(Path::new(&format!("/proc/{pid}/status")))?)
}

/// The fields of /proc/PID/status used, in kB as the kernel writes them.
pub fn parse_status(text: &str) -> Option<MemoryUse> {
    let (mut rss, mut anon, mut file, mut shmem, mut swap) = (None, None, None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key {
            "VmRSS" => &mut rss,
            "RssAnon" => &mut anon,
            "RssFile" => &mut file,
            "RssShmem" => &mut shmem,
            "VmSwap" => &mut swap,
            _ => continue,
        };
        *slot = kib(value);
    }
    let file = file?.checked_add(shmem.unwrap_or(0))?;
    Some(MemoryUse {
        resident: rss?,
        anon: anon?,
        file,
        swap: swap.unwrap_or(0),
    })
}

/// "   1776 kB" in bytes.
fn kib(value: &str) -> Option<u64> {
    let number = value.trim().strip_suffix("kB")?.trim();
    number.parse::<u64>().ok()?.checked_mul(1024)
}

/// Where a cgroup's memory numbers are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupMemoryFiles {
    /// A cgroup v2 directory with the memory controller.
    V2(PathBuf),
    /// A cgroup v1 memory-hierarchy directory.
    V1(PathBuf),
}

impl CgroupMemoryFiles {
    /// The memory files of cgroup v2 directory `dir` (at `path` in its
    /// hierarchy): its own when the v2 hierarchy has the memory controller;
    /// else, on a hybrid host, the v1 memory cgroup at the same path
    /// (systemd makes both); else the v1 memory cgroup of `member`, a
    /// process in it. None when neither is there.
    pub fn find(dir: &Path, path: &str, member: Option<u32>) -> Option<CgroupMemoryFiles> {
        if dir.join("memory.stat").is_file() && dir.join("memory.current").is_file() {
            return Some(CgroupMemoryFiles::V2(dir.to_path_buf()));
        }
        let root = v1_memory_mount()?;
        let same = root.join(path.trim_start_matches('/'));
        if path.starts_with('/') && !path.contains("..") && same.join("memory.stat").is_file() {
            return Some(CgroupMemoryFiles::V1(same));
        }
        let below = v1_memory_cgroup_of(member?)?;
        let dir = root.join(below.trim_start_matches('/'));
        (!below.contains("..") && dir.join("memory.stat").is_file())
            .then_some(CgroupMemoryFiles::V1(dir))
    }

    /// The cgroup's memory now; None once it was removed.
    pub fn read(&self) -> Option<MemoryUse> {
        match self {
            CgroupMemoryFiles::V2(dir) => {
                let current = read_bounded(&dir.join("memory.current"))?;
                let stat = read_bounded(&dir.join("memory.stat"))?;
                let swap = read_bounded(&dir.join("memory.swap.current"));
                parse_v2(&current, &stat, swap.as_deref())
            }
            CgroupMemoryFiles::V1(dir) => {
                let usage = read_bounded(&dir.join("memory.usage_in_bytes"))?;
                let stat = read_bounded(&dir.join("memory.stat"))?;
                parse_v1(&usage, &stat)
            }
        }
    }

    /// Which version, for the report.
    pub fn version(&self) -> u8 {
        match self {
            CgroupMemoryFiles::V2(_) => 2,
            CgroupMemoryFiles::V1(_) => 1,
        }
    }
}

/// A v2 cgroup's numbers: `memory.current`, `memory.stat`'s `anon` and
/// `file`, `memory.swap.current` (absent without swap accounting).
pub fn parse_v2(current: &str, stat: &str, swap: Option<&str>) -> Option<MemoryUse> {
    Some(MemoryUse {
        resident: current.trim().parse().ok()?,
        anon: stat_value(stat, "anon")?,
        file: stat_value(stat, "file")?,
        swap: swap.and_then(|s| s.trim().parse().ok()).unwrap_or(0),
    })
}

/// A v1 memory cgroup's numbers, of its whole subtree:
/// `memory.usage_in_bytes`, `memory.stat`'s `total_rss`, `total_cache`
/// and `total_swap` (absent without swap accounting).
pub fn parse_v1(usage: &str, stat: &str) -> Option<MemoryUse> {
    Some(MemoryUse {
        resident: usage.trim().parse().ok()?,
        anon: stat_value(stat, "total_rss")?,
        file: stat_value(stat, "total_cache")?,
        swap: stat_value(stat, "total_swap").unwrap_or(0),
    })
}

/// The value of `key` in a "key value" file.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The v1 memory hierarchy's mount point, from /proc/self/mountinfo.
fn v1_memory_mount() -> Option<PathBuf> {
    let mountinfo = read_bounded_big(Path::new("/proc/self/mountinfo"))?;
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let dash = fields.iter().position(|&f| f == "-")?;
        let is_memory = fields.get(dash + 1) == Some(&"cgroup")
            && fields
                .get(dash + 3)
                .is_some_and(|o| o.split(',').any(|o| o == "memory"));
        is_memory
            .then(|| fields.get(4).map(PathBuf::from))
            .flatten()
    })
}

/// Process `pid`'s cgroup in the v1 memory hierarchy ("N:memory:/path").
fn v1_memory_cgroup_of(pid: u32) -> Option<String> {
    let text = read_bounded(Path::new(&format!("/proc/{pid}/cgroup")))?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })
}

fn read_bounded(path: &Path) -> Option<String> {
    read_at_most(path, MAX_FILE)
}

/// mountinfo: a host with many containers has thousands of mounts.
fn read_bounded_big(path: &Path) -> Option<String> {
    read_at_most(path, 4 << 20)
}

fn read_at_most(path: &Path, max: u64) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(max)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_gives_resident_anonymous_file_and_swap() {
        let text = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    2024 kB\n\
                    RssAnon:\t     164 kB\nRssFile:\t    1800 kB\nRssShmem:\t      60 kB\n\
                    VmSwap:\t       8 kB\n";
        assert_eq!(
            parse_status(text),
            Some(MemoryUse {
                resident: 2024 << 10,
                anon: 164 << 10,
                file: 1860 << 10,
                swap: 8 << 10,
            })
        );
        assert_eq!(parse_status("Name:\tkthreadd\n"), None, "a kernel thread's");
        assert_eq!(
            parse_status("VmRSS: x kB\nRssAnon: 1 kB\nRssFile: 1 kB\n"),
            None
        );
        assert_eq!(
            parse_status("VmRSS: 99999999999999999 kB\nRssAnon: 1 kB\nRssFile: 1 kB\n"),
            None,
            "overflowing"
        );
    }

    #[test]
    fn cgroup_v2_and_v1_numbers_come_from_their_own_files() {
        let stat = "anon 4096\nfile 8192\nkernel 100\nshmem 0\n";
        assert_eq!(
            parse_v2("20000\n", stat, Some("512\n")),
            Some(MemoryUse {
                resident: 20000,
                anon: 4096,
                file: 8192,
                swap: 512
            })
        );
        assert_eq!(parse_v2("20000\n", stat, None).map(|m| m.swap), Some(0));
        // v1: the subtree's totals, not the cgroup's own `rss`.
        let v1 = "cache 1\nrss 2\nswap 3\ntotal_cache 10\ntotal_rss 20\ntotal_swap 30\n";
        assert_eq!(
            parse_v1("99\n", v1),
            Some(MemoryUse {
                resident: 99,
                anon: 20,
                file: 10,
                swap: 30
            })
        );
        assert_eq!(parse_v1("99\n", "total_cache 10\n"), None);
    }

    #[test]
    fn this_process_has_resident_anonymous_memory() {
        let me = of_process(std::process::id()).expect("own smaps_rollup");
        assert!(me.resident >= me.anon && me.anon > 0, "{me:?}");
    }
}
