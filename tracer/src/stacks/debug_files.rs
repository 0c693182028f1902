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
//! blazesym 0.2, when it reads a file's DWARF (`Elf::debug_syms`), follows
//! the links the file carries by itself: `.gnu_debuglink` (any name,
//! `../` included), `.gnu_debugaltlink` and `.debug_sup` (any path), in the
//! tracer's root, with a plain blocking open and a mmap of whatever is
//! there, before checking anything. So the debug file is found here and
//! given to blazesym as the source, and blazesym reads DWARF only of a
//! file that carries none of those sections (`DebugInfo::own_dwarf`,
//! `DebugFile::dwarf`); a link refused here is recorded as refused
//! (`DebugInfo::refused_link`), never as no link.

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
    /// blazesym may read the object's own DWARF: it was read, and carries
    /// no section blazesym would follow by itself (see the module
    /// documentation). False for an object that could not be read.
    pub own_dwarf: bool,
    /// A verified separate debug file, kept open.
    pub debug_file: Option<DebugFile>,
    /// The object's `.gnu_debuglink` names no bare file name: the name,
    /// escaped, for a note. Nothing follows it.
    pub refused_link: Option<String>,
    /// The object carries DWARF of its own (whether blazesym may read it
    /// or not: `own_dwarf`).
    pub has_dwarf: bool,
    /// Something here names functions beyond the exported ones: the
    /// object's own DWARF or `.symtab`, or its debug file. False for a
    /// stripped object without a debug file (its `.dynsym` names only
    /// what it exports), and for one that could not be read.
    pub symbols: bool,
    /// (file offset, file size, vaddr) of each loadable segment of the
    /// object: a debug file is looked up by address, not by offset.
    segments: Vec<(u64, u64, u64)>,
}

/// A separate debug file found for an object.
pub struct DebugFile {
    pub file: File,
    /// blazesym may read its DWARF: it carries no `.gnu_debugaltlink` or
    /// `.debug_sup` (a dwz supplementary file, which blazesym would open
    /// by itself); else only its symbol table is read.
    pub dwarf: bool,
}

/// What an object's `.gnu_debuglink` section says.
#[derive(Debug, PartialEq, Eq)]
enum Link {
    Absent,
    /// A bare file name and the CRC32 of the file it names.
    Named(String, u32),
    /// A name with a slash, `.` or `..`, empty, too long, not UTF-8, or a
    /// section that does not parse: escaped, for a note.
    Refused(String),
}

/// What the object's headers say.
struct Headers {
    build_id: Option<Vec<u8>>,
    link: Link,
    /// It carries `.gnu_debuglink`, `.gnu_debugaltlink` or `.debug_sup`.
    links_out: bool,
    has_dwarf: bool,
    has_symtab: bool,
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
            symbols: h.has_dwarf || h.has_symtab || debug_file.is_some(),
            has_dwarf: h.has_dwarf,
            own_dwarf: !h.links_out,
            debug_file,
            refused_link: match h.link {
                Link::Refused(name) => Some(name),
                Link::Absent | Link::Named(..) => None,
            },
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
    // By the section's presence, as blazesym looks for it: a section
    // that does not parse is refused, not taken for no link.
    let link = match obj.section_by_name(".gnu_debuglink") {
        None => Link::Absent,
        Some(_) => match obj.gnu_debuglink() {
            Ok(Some((name, crc))) => match link_name(name) {
                Some(name) => Link::Named(name, crc),
                None => Link::Refused(crate::escape::bytes(name)),
            },
            Ok(None) | Err(_) => Link::Refused("(unreadable section)".to_string()),
        },
    };
    let links_out = link != Link::Absent
        || obj.section_by_name(".gnu_debugaltlink").is_some()
        || obj.section_by_name(".debug_sup").is_some();
    Some(Headers {
        build_id: obj.build_id().ok().flatten().map(<[u8]>::to_vec),
        link,
        links_out,
        has_dwarf: obj
            .section_by_name(".debug_info")
            .is_some_and(|s| s.size() > 0 && s.file_range().is_some()),
        has_symtab: obj
            .section_by_name(".symtab")
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

/// A link names a file in a directory (gdb searches it in the object's
/// directory, its `.debug/` and the global debug directories): nothing
/// with a slash, nothing that climbs, not empty, not too long, UTF-8.
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
        if let Link::Named(name, crc) = &h.link {
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

fn find(h: &Headers, object: &File, root: Option<&File>, path: &str) -> Option<DebugFile> {
    use std::os::unix::fs::MetadataExt as _;
    let me = object.metadata().ok()?;
    for (r, p, check) in candidates(h, root, path) {
        // Confined (openat2 RESOLVE_IN_ROOT, no magic links, O_NONBLOCK),
        // a regular file of at most MAX_DEBUG_FILE_BYTES: see roots.rs.
        let Ok(file) = open_in_root(r, &p, MAX_DEBUG_FILE_BYTES) else {
            continue;
        };
        let Ok(meta) = file.metadata() else { continue };
        if (meta.dev(), meta.ino()) == (me.dev(), me.ino()) {
            continue; // a link to itself
        }
        if let Some(dwarf) = verify(h, &file, check) {
            return Some(DebugFile { file, dwarf });
        }
    }
    None
}

/// Whether `file` is the debug file of the object `h` describes, and one
/// blazesym can be given: DWARF of its own, no debug link of its own (not
/// even a refused one). Some(whether blazesym may read its DWARF).
fn verify(h: &Headers, file: &File, check: Check) -> Option<bool> {
    let d = headers(file)?;
    if !d.has_dwarf || d.link != Link::Absent {
        return None;
    }
    let ids_agree = match (&h.build_id, &d.build_id) {
        (Some(a), Some(b)) => a == b,
        (None, None) => true,
        _ => false,
    };
    let ok = match check {
        Check::BuildId => ids_agree,
        Check::Crc(crc) => ids_agree && crc32(file).is_ok_and(|c| c == crc),
    };
    ok.then_some(!d.links_out)
}

/// Why a fetched file is not used.
#[derive(Debug, PartialEq, Eq)]
pub enum NotTheDebugFile {
    /// Not ELF, or larger than MAX_DEBUG_FILE_BYTES.
    Unreadable,
    /// Its build id (hex, or none) is not the one asked for.
    OtherBuildId(Option<String>),
    /// Neither DWARF nor a symbol table.
    NoSymbols,
    /// It carries a `.gnu_debuglink` itself (a debug file never does).
    Links,
}

impl std::fmt::Display for NotTheDebugFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTheDebugFile::Unreadable => f.write_str("not an ELF file of at most 2 GiB"),
            NotTheDebugFile::OtherBuildId(Some(id)) => write!(f, "its build id is {id}"),
            NotTheDebugFile::OtherBuildId(None) => f.write_str("it has no build id"),
            NotTheDebugFile::NoSymbols => f.write_str("it has neither DWARF nor symbols"),
            NotTheDebugFile::Links => f.write_str("it has a debug link of its own"),
        }
    }
}

/// `file`, fetched from a server (or its cache) for build id `build_id`
/// (hex), if it is that object's debug file: its own build id is that
/// one, it names functions, and it links nowhere blazesym would follow.
pub fn fetched(file: File, build_id: &str) -> Result<DebugFile, NotTheDebugFile> {
    let d = headers(&file).ok_or(NotTheDebugFile::Unreadable)?;
    let id = d.build_id.as_deref().map(hex);
    if id.as_deref() != Some(build_id) {
        return Err(NotTheDebugFile::OtherBuildId(id));
    }
    if !d.has_dwarf && !d.has_symtab {
        return Err(NotTheDebugFile::NoSymbols);
    }
    if d.link != Link::Absent {
        return Err(NotTheDebugFile::Links);
    }
    Ok(DebugFile {
        file,
        dwarf: d.has_dwarf && !d.links_out,
    })
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
