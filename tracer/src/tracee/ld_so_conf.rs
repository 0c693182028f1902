//! ld.so.conf: the library directories it lists and the files it
//! includes, read from a process's root directory (hostile: bounded reads,
//! bounded includes, the line parser fuzzed in `fuzz/`).

use std::{
    ffi::OsStr,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use super::elf::read_bounded;

/// Directories listed in ld.so.conf and the files it includes.
pub(super) fn ld_so_conf_dirs(conf: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    read_ld_so_conf(conf, &mut dirs, 0);
    dirs
}

fn read_ld_so_conf(conf: &Path, dirs: &mut Vec<PathBuf>, depth: u32) {
    let Ok(text) = read_bounded(conf, MAX_CONFIG_BYTES) else {
        return;
    };
    // The root prefix of `conf` (/proc/PID/root) applies to includes too.
    let root = conf
        .as_os_str()
        .as_bytes()
        .strip_suffix(b"/etc/ld.so.conf")
        .unwrap_or(b"")
        .to_vec();
    for line in ld_so_conf_lines(&text) {
        match line {
            ConfLine::Dir(dir) => dirs.push(PathBuf::from(OsStr::from_bytes(dir))),
            ConfLine::Include { dir, suffix } => {
                if depth > 4 {
                    continue;
                }
                let mut path = root.clone();
                path.extend_from_slice(dir);
                let Ok(entries) = std::fs::read_dir(OsStr::from_bytes(&path)) else {
                    continue;
                };
                let mut files: Vec<PathBuf> = entries
                    .filter_map(|e| Some(e.ok()?.path()))
                    .filter(|p| p.as_os_str().as_bytes().ends_with(suffix))
                    .take(MAX_CONFIG_INCLUDES)
                    .collect();
                files.sort();
                for f in files {
                    read_ld_so_conf(&f, dirs, depth + 1);
                }
            }
        }
    }
}

/// One meaningful line of an ld.so.conf file.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfLine<'a> {
    /// A library directory.
    Dir(&'a [u8]),
    /// `include DIR/*SUFFIX` (only that form of glob is supported) or
    /// `include FILE` (suffix "").
    Include { dir: &'a [u8], suffix: &'a [u8] },
}

/// The directories and includes of ld.so.conf text (comments, blank lines
/// and anything else dropped). Pure, so it is fuzzed (`fuzz/`).
pub fn ld_so_conf_lines(text: &[u8]) -> Vec<ConfLine<'_>> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = line
            .split(|&b| b == b'#')
            .next()
            .unwrap_or(b"")
            .trim_ascii();
        if let Some(pattern) = line.strip_prefix(b"include") {
            let pattern = pattern.trim_ascii();
            let (dir, suffix) = match pattern.windows(2).rposition(|w| w == b"/*") {
                Some(i) => (&pattern[..i], &pattern[i + 2..]),
                None => (pattern, &b""[..]),
            };
            out.push(ConfLine::Include { dir, suffix });
        } else if line.starts_with(b"/") {
            out.push(ConfLine::Dir(line));
        }
    }
    out
}

/// Most bytes of an ld.so.conf file, and most files one include reads.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
const MAX_CONFIG_INCLUDES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_config_files_are_refused_not_read() {
        // A FIFO would block the tracer, /dev/zero would fill its memory.
        let dir = std::env::temp_dir().join(format!("memtrace-hostile-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).expect("mkdir");
        let fifo = dir.join("etc/ld.so.conf");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).expect("path");
        // SAFETY: mkfifo takes a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_bounded(&fifo, MAX_CONFIG_BYTES).is_err());
        assert!(ld_so_conf_dirs(&fifo).is_empty());
        assert!(read_bounded(Path::new("/dev/zero"), MAX_CONFIG_BYTES).is_err());
        let big = dir.join("big");
        std::fs::write(&big, vec![b'/'; 100]).expect("write");
        assert!(read_bounded(&big, 99).is_err());
        assert_eq!(read_bounded(&big, 100).expect("fits").len(), 100);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ld_so_conf_lines_keep_dirs_and_includes() {
        let text = b"# c\n  /opt/a # trailing\ninclude /etc/x.d/*.conf\ninclude /etc/one\nbogus\n";
        assert_eq!(
            ld_so_conf_lines(text),
            [
                ConfLine::Dir(b"/opt/a"),
                ConfLine::Include {
                    dir: b"/etc/x.d",
                    suffix: b".conf"
                },
                ConfLine::Include {
                    dir: b"/etc/one",
                    suffix: b""
                },
            ]
        );
    }

    #[test]
    fn ld_so_conf_includes_are_followed() {
        let dir = std::env::temp_dir().join(format!("memtrace-ldconf-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc/ld.so.conf.d")).expect("mkdir");
        std::fs::write(
            dir.join("etc/ld.so.conf"),
            "# comment\ninclude /etc/ld.so.conf.d/*.conf\n/opt/top\n",
        )
        .expect("write");
        std::fs::write(dir.join("etc/ld.so.conf.d/a.conf"), "/opt/a\n").expect("write");
        std::fs::write(dir.join("etc/ld.so.conf.d/b.txt"), "/opt/ignored\n").expect("write");
        let dirs = ld_so_conf_dirs(&dir.join("etc/ld.so.conf"));
        assert_eq!(dirs, [Path::new("/opt/a"), Path::new("/opt/top")]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
