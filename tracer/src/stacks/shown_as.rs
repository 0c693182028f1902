//! Programs named as their users invoked them. Debian's
//! /usr/bin/redis-server is a symbolic link to redis-check-rdb: the maps
//! of a redis server name the link's target, and its frames would read
//! `redis-check-rdb` though the user started, and knows, `redis-server`.
//! When a process's argv[0] names a symbolic link to its executable, the
//! executable's frames are shown under that name.
//!
//! Only stat(2) and readlink(2) through /proc/PID: nothing a process names
//! is opened. Bounded: at most `MAX_NAMES` files, each named once (the
//! first invocation seen; a file run under two names keeps the first), for
//! the trace's life.

use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::Path};

/// Most executables renamed in one trace.
const MAX_NAMES: usize = 256;

/// Longest name kept (a path).
const MAX_NAME: usize = 4096;

#[derive(Default)]
pub struct ShownAs {
    /// The executable's path (as /proc/PID/maps and exe show it) → the
    /// name the user gave.
    names: HashMap<String, String>,
}

impl ShownAs {
    /// Names `file` as `shown` from now on (`--binary LINK`).
    pub fn insert(&mut self, file: String, shown: String) {
        if self.names.len() < MAX_NAMES {
            self.names.entry(file).or_insert(shown);
        }
    }

    /// The name `path` is shown under.
    pub fn get<'a>(&'a self, path: &'a str) -> &'a str {
        self.names.get(path).map_or(path, String::as_str)
    }

    /// Process `pid`'s maps were read for its image: if its argv[0] names
    /// a symbolic link to its executable, that executable is shown under
    /// the link's path.
    pub fn note_process(&mut self, pid: u32) {
        if self.names.len() >= MAX_NAMES {
            return;
        }
        if let Some((exe, link)) = invoked_through_link(pid) {
            self.insert(exe, link);
        }
    }
}

/// (the executable's path, the link's path) when `pid` was started through
/// a symbolic link to its executable: argv[0] itself when absolute, else
/// argv[0]'s file name in the executable's directory (a command found on
/// PATH, as `redis-server` is in /usr/bin beside redis-check-rdb).
fn invoked_through_link(pid: u32) -> Option<(String, String)> {
    let proc = format!("/proc/{pid}");
    let exe = std::fs::read_link(format!("{proc}/exe")).ok()?;
    let exe = exe.to_str()?.to_string();
    let argv0 = crate::tracee::process::program_of(pid)?;
    let link = match argv0.starts_with('/') {
        true => argv0,
        false => {
            let name = Path::new(&argv0).file_name()?.to_str()?;
            let dir = Path::new(&exe).parent()?.to_str()?;
            format!("{}/{name}", dir.trim_end_matches('/'))
        }
    };
    if link == exe || link.len() > MAX_NAME {
        return None;
    }
    // Both looked up inside the process's root, the link without following
    // it, its target as the kernel resolves it.
    let in_root = format!("{proc}/root{link}");
    let is_link = std::fs::symlink_metadata(&in_root).is_ok_and(|m| m.file_type().is_symlink());
    let (target, running) = (
        std::fs::metadata(&in_root).ok()?,
        std::fs::metadata(format!("{proc}/exe")).ok()?,
    );
    let same = (target.dev(), target.ino()) == (running.dev(), running.ino());
    (is_link && same).then_some((exe, link))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_started_through_a_symbolic_link_is_shown_under_the_link() {
        let dir = std::env::temp_dir().join(format!("memtrace-shown-as-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (bin, link) = (dir.join("real-sleep"), dir.join("sleep-link"));
        std::fs::copy("/bin/sleep", &bin).expect("copy sleep");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&bin, &link).expect("symlink");
        let mut shown = ShownAs::default();
        for (argv0, expect_link) in [(&link, true), (&bin, false)] {
            let mut child = std::process::Command::new(argv0)
                .arg("5")
                .spawn()
                .expect("start sleep");
            // Until exec, the child runs this test's image.
            let exe = format!("/proc/{}/exe", child.id());
            for _ in 0..500 {
                let program = crate::tracee::process::program_of(child.id());
                if std::fs::read_link(&exe).is_ok_and(|e| e == bin) && program.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let found = invoked_through_link(child.id());
            let _ = child.kill();
            let _ = child.wait();
            let pair = (bin.display().to_string(), link.display().to_string());
            assert_eq!(found, expect_link.then_some(pair), "{}", argv0.display());
            if let Some((exe, link)) = found {
                shown.insert(exe, link);
            }
        }
        let bin = bin.display().to_string();
        assert_eq!(shown.get(&bin), link.display().to_string());
        assert_eq!(shown.get("/usr/lib/libc.so.6"), "/usr/lib/libc.so.6");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
