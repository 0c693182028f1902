//! Separate debug files (`objcopy --only-keep-debug`, distributions'
//! `-dbg`/`-debuginfo` packages) of a mapped object without debug
//! information, found as gdb finds them (its manual, "Separate Debug
//! Files"): by build id, `/usr/lib/debug/.build-id/xx/rest.debug`, then by
//! the name `.gnu_debuglink` gives, in the object's directory, its
//! `.debug/` subdirectory and `/usr/lib/debug/<dir>/`; first in the
//! process's own root, then in the host's `/usr/lib/debug`.
//!
//! Everything here comes from files the traced process controls: a
//! candidate is opened inside the root it is looked up in (no link leads
//! out), must be a regular file of bounded size, and is used only if its
//! build id is the object's (by build id) or its CRC32 is the one the link
//! carries (by link; and its build id, if both have one).
//!
//! blazesym 0.2 follows debug links itself (`Builder::set_debug_dirs`),
//! but only in the tracer's root, by paths that follow links anywhere,
//! without checking a build id, and only for objects that carry a link:
//! so the file is found here and given to blazesym as the source.

use std::{
    fs::File,
    io::{self, Read as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use super::roots::open_in_root;

/// Debug files larger than this are not used (nor read for their CRC).
pub const MAX_DEBUG_FILE_BYTES: u64 = 1 << 31;

/// Longest `.gnu_debuglink` name used (a file name, NAME_MAX).
const MAX_LINK_NAME: usize = 255;

/// What symbolization needs to know about one object, read once.
#[derive(Default)]
pub struct DebugInfo {
    /// The GNU build id in hex, as `file` and pprof show it.
    pub build_id: Option<Arc<str>>,
    /// The object carries a `.gnu_debuglink` (so blazesym must not be let
    /// to follow it: see the module documentation).
    pub has_debuglink: bool,
    /// A verified separate debug file, kept open.
    pub debug_file: Option<File>,
    /// (file offset, file size, vaddr) of each loadable segment of the
    /// object: a debug file is looked up by address, not by offset.
    segments: Vec<(u64, u64, u64)>,
}

/// What the object's headers say.
struct Headers {
    build_id: Option<Vec<u8>>,
    /// (name, CRC32) from `.gnu_debuglink`.
    link: Option<(String, u32)>,
    has_dwarf: bool,
    segments: Vec<(u64, u64, u64)>,
}

impl DebugInfo {
    /// Reads the object `file` (seen as `path` inside `root`) and, when it
    /// has no DWARF of its own, looks for its debug file. Never fails: an
    /// unreadable object has no build id and no debug file.
    pub fn read(file: &File, root: Option<&File>, path: &str) -> DebugInfo {
        let Some(h) = headers(file) else {
            return DebugInfo::default();
        };
        let debug_file = if h.has_dwarf {
            None
        } else {
            find(&h, file, root, path)
        };
        DebugInfo {
            build_id: h.build_id.as_deref().map(|id| Arc::from(hex(id))),
            has_debuglink: h.link.is_some(),
            debug_file,
            segments: h.segments,
        }
    }

    /// The address (vaddr) of file offset `offset` in the object.
    pub fn vaddr(&self, offset: u64) -> Option<u64> {
        self.segments.iter().find_map(|&(start, size, vaddr)| {
            let rel = offset.checked_sub(start)?;
            (rel < size).then(|| vaddr.checked_add(rel)).flatten()
        })
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Only the headers and the few sections asked for are read (object's
/// ReadCache), never the whole file.
fn headers(file: &File) -> Option<Headers> {
    let size = file.metadata().ok()?.len();
    if size > MAX_DEBUG_FILE_BYTES {
        return None;
    }
    let cache = object::ReadCache::new(file);
    let obj = object::File::parse(&cache).ok()?;
    let link = obj
        .gnu_debuglink()
        .ok()
        .flatten()
        .and_then(|(name, crc)| Some((link_name(name)?, crc)));
    Some(Headers {
        build_id: obj.build_id().ok().flatten().map(<[u8]>::to_vec),
        link,
        has_dwarf: obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0 && s.file_range().is_some()),
        segments: obj
            .segments()
            .map(|seg| {
                let (offset, size) = seg.file_range();
                (offset, size, seg.address())
            })
            .collect(),
    })
}

/// A link names a file in a directory: nothing with a slash, nothing that
/// climbs, not empty, not too long, UTF-8.
fn link_name(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let ok = !name.is_empty()
        && name.len() <= MAX_LINK_NAME
        && !name.contains('/')
        && name != "."
        && name != "..";
    ok.then(|| name.to_string())
}

/// The places to look, in order: (root to look in, path inside it, how to
/// verify what is there).
fn candidates<'r>(
    h: &Headers,
    root: Option<&'r File>,
    path: &str,
) -> Vec<(Option<&'r File>, PathBuf, Check)> {
    let dir = Path::new(path).parent().unwrap_or(Path::new("/"));
    let under_debug = Path::new("/usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(dir));
    // The process's own root first, then the host's (once if they are the same).
    let mut roots = vec![root];
    if root.is_some() {
        roots.push(None);
    }
    let mut out = Vec::new();
    for (i, &r) in roots.iter().enumerate() {
        let own = i == 0;
        if let Some(id) = h.build_id.as_deref().filter(|id| id.len() >= 2) {
            let p = format!(
                "/usr/lib/debug/.build-id/{:02x}/{}.debug",
                id[0],
                hex(&id[1..])
            );
            out.push((r, PathBuf::from(p), Check::BuildId));
        }
        if let Some((name, crc)) = &h.link {
            if own {
                out.push((r, dir.join(name), Check::Crc(*crc)));
                out.push((r, dir.join(".debug").join(name), Check::Crc(*crc)));
            }
            out.push((r, under_debug.join(name), Check::Crc(*crc)));
        }
    }
    out
}

#[derive(Clone, Copy)]
enum Check {
    BuildId,
    Crc(u32),
}

fn find(h: &Headers, object: &File, root: Option<&File>, path: &str) -> Option<File> {
    use std::os::unix::fs::MetadataExt as _;
    let me = object.metadata().ok()?;
    for (r, p, check) in candidates(h, root, path) {
        let Ok(file) = open_in_root(r, &p) else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        if (meta.dev(), meta.ino()) == (me.dev(), me.ino()) || meta.len() > MAX_DEBUG_FILE_BYTES {
            continue; // a link to itself, or too big
        }
        if verify(h, &file, check) {
            return Some(file);
        }
    }
    None
}

/// Whether `file` is the debug file of the object `h` describes, and one
/// blazesym can be given: DWARF of its own, no further link.
fn verify(h: &Headers, file: &File, check: Check) -> bool {
    let Some(d) = headers(file) else {
        return false;
    };
    if !d.has_dwarf || d.link.is_some() {
        return false;
    }
    let ids_agree = match (&h.build_id, &d.build_id) {
        (Some(a), Some(b)) => a == b,
        (None, None) => true,
        _ => false,
    };
    match check {
        Check::BuildId => ids_agree,
        Check::Crc(crc) => ids_agree && crc32(file).is_ok_and(|c| c == crc),
    }
}

/// The CRC32 `.gnu_debuglink` carries: of the whole file (zlib's, as
/// gdb's `gnu_debuglink_crc32`).
fn crc32(mut file: &File) -> io::Result<u32> {
    use std::io::Seek as _;
    file.seek(io::SeekFrom::Start(0))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > MAX_DEBUG_FILE_BYTES {
            return Err(io::Error::other("debug file too large"));
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize())
}

#[cfg(test)]
mod tests;
