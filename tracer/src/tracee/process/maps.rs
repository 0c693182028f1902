//! /proc/PID/maps: the file-backed mappings, their paths as bytes, and the
//! anonymous executable ones (JIT code).

use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _, path::PathBuf};

/// One line of /proc/PID/maps that is backed by a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub executable: bool,
    /// Path as the process sees it.
    pub path: String,
    /// (device, inode) of the mapped file as the maps show them (the
    /// device as major << 32 | minor); (0, 0) when not known.
    pub dev_inode: (u64, u64),
}

/// Parses /proc/PID/maps, keeping file-backed mappings only. The text is
/// bytes: a path may hold any byte but a newline (which the kernel shows
/// as `\012`).
pub fn parse_maps(text: &[u8]) -> Vec<Mapping> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| Some(parse_maps_line(line)?.0))
        .collect()
}

/// `parse_maps`, with each mapping's file path as the bytes the process
/// sees (without the " (deleted)" mark): `Mapping::path` is its display
/// form.
pub fn parse_maps_files(text: &[u8]) -> Vec<(Mapping, PathBuf)> {
    text.split(|&b| b == b'\n')
        .filter_map(|line| {
            let (m, file) = parse_maps_line(line)?;
            Some((m, PathBuf::from(OsStr::from_bytes(&file))))
        })
        .collect()
}

/// Anonymous executable mappings (JIT code): no file, no unwind table;
/// the kernel walker takes frame-pointer steps there. The vDSO (which has
/// CFI of its own), vsyscall and the uprobes trampoline page are left out.
pub fn parse_jit(text: &[u8]) -> Vec<std::ops::Range<u64>> {
    let jit = |line: &[u8]| {
        let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
        let range = std::str::from_utf8(fields.next()?).ok()?;
        let perms = fields.next()?;
        let inode = fields.nth(2)?;
        let name = fields.next().unwrap_or_default();
        let special = name.starts_with(b"[v") || name == b"[uprobes]";
        if perms.get(2) != Some(&b'x') || inode != b"0" || special {
            return None;
        }
        let (start, end) = range.split_once('-')?;
        Some(u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?)
    };
    text.split(|&b| b == b'\n').filter_map(jit).collect()
}

/// One line: the mapping and its file's path as bytes (unescaped, without
/// " (deleted)"), borrowed from the line unless a newline was escaped in
/// it. One allocation per line (the path's display form): the maps are
/// read again and again for short-lived processes.
pub(super) fn parse_maps_line(line: &[u8]) -> Option<(Mapping, std::borrow::Cow<'_, [u8]>)> {
    let mut fields = line.splitn(6, |&b| b == b' ');
    let mut next = || std::str::from_utf8(fields.next()?).ok();
    let range = next()?;
    let perms = next()?;
    let offset = u64::from_str_radix(next()?, 16).ok()?;
    let dev = next()?;
    let inode: u64 = next()?.parse().ok()?;
    let path = fields.next()?.trim_ascii_start();
    if inode == 0 || !path.starts_with(b"/") {
        return None; // anonymous, [heap], [stack], [vdso]...
    }
    let (start, end) = range.split_once('-')?;
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    let file = if path.windows(4).any(|w| w == b"\\012") {
        std::borrow::Cow::Owned(unescape_newlines(path))
    } else {
        std::borrow::Cow::Borrowed(path)
    };
    Some((
        Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            offset,
            executable: perms.as_bytes().get(2) == Some(&b'x'),
            path: String::from_utf8_lossy(&file).into_owned(),
            dev_inode: (parse_dev(dev).unwrap_or(0), inode),
        },
        file,
    ))
}

/// A maps line's device, `MAJOR:MINOR` in hex, as major << 32 | minor.
fn parse_dev(dev: &str) -> Option<u64> {
    let (major, minor) = dev.split_once(':')?;
    Some(u64::from_str_radix(major, 16).ok()? << 32 | u64::from_str_radix(minor, 16).ok()?)
}

/// The kernel shows a newline in a mapped path as `\012`.
fn unescape_newlines(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut rest = path;
    while let Some((&b, tail)) = rest.split_first() {
        if let Some(after) = rest.strip_prefix(b"\\012") {
            out.push(b'\n');
            rest = after;
        } else {
            out.push(b);
            rest = tail;
        }
    }
    out
}

/// A path from /proc/PID/maps or an exe link, without the kernel's
/// " (deleted)" mark for a file unlinked since it was opened.
pub fn strip_deleted(path: &[u8]) -> PathBuf {
    let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
    PathBuf::from(OsStr::from_bytes(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 1234 /usr/bin/target
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 1234 /usr/bin/target
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0 [heap]
7f1e2a028000-7f1e2a1bd000 r-xp 00028000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1e2a400000-7f1e2a401000 r-xp 00000000 fe:01 999 /tmp/gone lib.so (deleted)
7ffd1c7e0000-7ffd1c7e2000 r-xp 00000000 00:00 0 [vdso]
";

    #[test]
    fn parses_file_backed_mappings_only() {
        let maps = parse_maps(MAPS.as_bytes());
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[1],
            Mapping {
                start: 0x55d0_c8a0_1000,
                end: 0x55d0_c8a0_2000,
                offset: 0x1000,
                executable: true,
                path: "/usr/bin/target".into(),
                dev_inode: (0xfe << 32 | 1, 1234),
            }
        );
        assert!(!maps[0].executable);
        assert_eq!(maps[3].path, "/tmp/gone lib.so");
    }

    #[test]
    fn maps_paths_are_bytes() {
        let maps = b"7f00-7f10 r-xp 00000000 fe:01 77 /tmp/caf\xe9 x\\012y (deleted)\n";
        let parsed = parse_maps_files(maps);
        assert_eq!(parsed.len(), 1);
        let (m, file) = &parsed[0];
        assert_eq!(file.as_os_str().as_bytes(), b"/tmp/caf\xe9 x\ny");
        assert_eq!(m.path, "/tmp/caf\u{fffd} x\ny");
    }

    #[test]
    fn jit_is_anonymous_executable_memory_only() {
        let text = b"7f0000000000-7f0000002000 r-xp 00000000 00:00 0 \n\
7f0000002000-7f0000003000 rwxp 00000000 00:00 0                  [anon:jit]\n\
7f0000004000-7f0000005000 r-xp 00000000 00:00 0                  [vdso]\n\
7f0000006000-7f0000007000 r-xp 00000000 00:00 0                  [uprobes]\n\
7f0000008000-7f0000009000 rw-p 00000000 00:00 0 \n\
55d000000000-55d000001000 r-xp 00001000 08:01 1234               /usr/bin/x\n";
        let want = [
            0x7f00_0000_0000..0x7f00_0000_2000,
            0x7f00_0000_2000..0x7f00_0000_3000,
        ];
        assert_eq!(parse_jit(text), want);
    }
}
