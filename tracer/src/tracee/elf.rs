//! Reading ELF files that a traced process maps or would load: the entry
//! points they define and where, which of those only jump elsewhere (PLT
//! thunks, direct jumps), and what the loader needs to find their
//! dependencies. Every file read here is hostile (fuzzed: `fuzz/`).

use std::{
    collections::{HashMap, HashSet},
    ffi::{OsStr, OsString},
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    path::Path,
    sync::Arc,
};

use anyhow::Context as _;
use object::{
    read::elf::ElfFile64, Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _,
};

use super::entry_points::{AllocatorKind, ENTRY_POINTS, FAMILIES};

/// What one ELF file offers: the entry points it defines (name to file
/// offset) and what the loader needs to find its dependencies. Names of
/// files and directories are bytes (OsString): ELF strings need not be
/// UTF-8.
#[derive(Debug, Default)]
pub struct ObjectInfo {
    pub defined: HashMap<String, u64>,
    /// Symbol sizes of the defined entry points (0 when unknown).
    pub sizes: HashMap<String, u64>,
    /// Entry points whose first instruction jumps to another function
    /// that is counted instead: see `Thunk`.
    pub thunks: HashMap<String, Thunk>,
    pub(super) needed: Vec<OsString>,
    pub(super) runpath: Vec<OsString>,
    pub(super) rpath: Vec<OsString>,
    pub(super) soname: Option<OsString>,
    /// 64-bit x86: a library the loader could pick for this process.
    pub(super) native: bool,
    /// What it is built for when not `native` ("32-bit I386"...).
    pub(super) machine: String,
    /// Has a program interpreter (dynamically linked executable).
    pub(super) interp: bool,
    /// Has a symbol table (not stripped).
    pub(super) symbols: bool,
    /// Defines glibc's internal `__libc_malloc` (libc, or a static binary).
    glibc: bool,
    /// The families (`entry_points::FAMILIES`, by index) one of whose
    /// `confirms` functions it defines.
    confirmed: u32,
    /// Imports `dlsym`: a library defining malloc and free that looks up
    /// the next definition is an interposer (heaptrack's preload library,
    /// which also wraps `mi_malloc`), not an allocator.
    imports_dlsym: bool,
}

/// An entry point that is only a jump to another function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Thunk {
    /// `jmp X@plt` (jemalloc's operator delete is `jmp free@plt`): the
    /// symbol the stub's GOT slot is relocated to, wherever the loader
    /// resolves it.
    Plt(String),
    /// `jmp X` straight to another entry point of the same object
    /// (jemalloc's `_Znam` is `jmp _Znwm`).
    Direct(String),
}

impl ObjectInfo {
    pub fn parse(path: &Path) -> anyhow::Result<ObjectInfo> {
        let data = read_bounded(path, MAX_OBJECT_BYTES)
            .with_context(|| format!("reading {}", path.display()))?;
        ObjectInfo::from_bytes(&data)
            .with_context(|| format!("{} is not an ELF file", path.display()))
    }

    /// What the ELF image `data` defines. `data` comes from files that a
    /// traced process controls: anything may be in it (fuzzed: `fuzz/`).
    pub fn from_bytes(data: &[u8]) -> anyhow::Result<ObjectInfo> {
        let file = object::File::parse(data)?;
        let wanted: HashSet<&str> = ENTRY_POINTS.iter().map(|e| e.name.as_str()).collect();
        let mut info = ObjectInfo {
            native: file.architecture() == object::Architecture::X86_64 && file.is_64(),
            machine: format!(
                "{}-bit {:?}",
                if file.is_64() { 64 } else { 32 },
                file.architecture()
            ),
            interp: file.section_by_name(".interp").is_some(),
            symbols: file.symbols().next().is_some(),
            ..ObjectInfo::default()
        };
        let mut starts: HashMap<u64, String> = HashMap::new();
        for sym in file.dynamic_symbols().chain(file.symbols()) {
            if sym.is_undefined() {
                info.imports_dlsym |= sym.name() == Ok("dlsym");
                continue;
            }
            if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            info.glibc |= name == "__libc_malloc";
            for (i, family) in FAMILIES.iter().enumerate() {
                if family.confirms.contains(&name) {
                    info.confirmed |= 1 << i;
                }
            }
            if !wanted.contains(name) || info.defined.contains_key(name) {
                continue;
            }
            if let Some(offset) = vaddr_to_file_offset(&file, sym.address()) {
                info.defined.insert(name.to_string(), offset);
                info.sizes.insert(name.to_string(), sym.size());
                starts
                    .entry(sym.address())
                    .or_insert_with(|| name.to_string());
            }
        }
        for (&addr, name) in &starts {
            if let Some(thunk) = jump_target(&file, data, addr, &starts) {
                info.thunks.insert(name.clone(), thunk);
            }
        }
        // Aliases share an address: each name gets the thunk of the first.
        let names: Vec<(String, u64)> = info.defined.iter().map(|(n, &o)| (n.clone(), o)).collect();
        for (name, offset) in names {
            let first = info
                .defined
                .iter()
                .find(|(n, &o)| o == offset && info.thunks.contains_key(*n));
            if let Some(thunk) = first.and_then(|(n, _)| info.thunks.get(n)).cloned() {
                info.thunks.entry(name).or_insert(thunk);
            }
        }
        info.read_dynamic(data);
        Ok(info)
    }

    /// DT_NEEDED, DT_RUNPATH, DT_RPATH and DT_SONAME, as bytes.
    fn read_dynamic(&mut self, data: &[u8]) {
        let Ok(elf) = ElfFile64::<object::Endianness>::parse(data) else {
            return;
        };
        let table = elf
            .elf_section_table()
            .dynamic_table(elf.endian(), data)
            .unwrap_or_default();
        for d in &table {
            let Ok(value) = table.string(d) else { continue };
            let value = OsStr::from_bytes(value).to_os_string();
            let split = |v: &OsStr| {
                v.as_bytes()
                    .split(|&b| b == b':')
                    .map(|s| OsStr::from_bytes(s).to_os_string())
                    .collect::<Vec<_>>()
            };
            match d.tag {
                object::elf::DT_NEEDED => self.needed.push(value),
                object::elf::DT_RUNPATH => self.runpath = split(&value),
                object::elf::DT_RPATH => self.rpath = split(&value),
                object::elf::DT_SONAME => self.soname = Some(value),
                _ => {}
            }
        }
    }

    /// 64-bit x86, the only kind of program traced.
    pub fn is_native(&self) -> bool {
        self.native
    }

    /// No program interpreter: a static executable (or a library).
    pub fn is_static(&self) -> bool {
        !self.interp
    }

    /// Has a symbol table (not stripped).
    pub fn has_symbols(&self) -> bool {
        self.symbols
    }

    /// "32-bit I386" and the like.
    pub fn machine(&self) -> &str {
        &self.machine
    }

    pub fn defines_malloc_and_free(&self) -> bool {
        self.defined.contains_key("malloc") && self.defined.contains_key("free")
    }

    /// The allocator this object is, from what it defines.
    pub(super) fn kind(&self, path: &Path) -> AllocatorKind {
        let has = |n: &&str| self.defined.contains_key(*n);
        let family = FAMILIES.iter().enumerate().find(|(i, f)| {
            f.marks.iter().any(has) && (f.confirms.is_empty() || self.confirmed & (1 << i) != 0)
        });
        if let Some((_, f)) = family {
            f.kind
        } else if is_libc(path) || self.glibc {
            AllocatorKind::Glibc
        } else if self.defines_malloc_and_free() && self.imports_dlsym {
            AllocatorKind::Interposer
        } else {
            AllocatorKind::Own
        }
    }
}

/// When the function at `addr` starts with a jump to a PLT stub, or to the
/// start of another entry point (`starts`), where it goes.
fn jump_target(
    file: &object::File<'_>,
    data: &[u8],
    addr: u64,
    starts: &HashMap<u64, String>,
) -> Option<Thunk> {
    use iced_x86::{Code, Decoder, DecoderOptions};
    use object::ObjectSymbolTable as _;
    let decode_at = |vaddr: u64| {
        let start = vaddr_to_file_offset(file, vaddr)? as usize;
        let bytes = data.get(start..(start + 16).min(data.len()))?;
        Some(Decoder::with_ip(64, bytes, vaddr, DecoderOptions::NONE))
    };
    let mut decoder = decode_at(addr)?;
    let mut first = decoder.decode();
    if first.code() == Code::Endbr64 {
        first = decoder.decode();
    }
    if !matches!(first.code(), Code::Jmp_rel32_64 | Code::Jmp_rel8_64) {
        return None;
    }
    let stub = first.near_branch_target();
    if let Some(name) = starts.get(&stub).filter(|_| stub != addr) {
        return Some(Thunk::Direct(name.clone()));
    }
    let in_plt = file.sections().any(|sec| {
        matches!(sec.name(), Ok(".plt" | ".plt.sec"))
            && (sec.address()..sec.address() + sec.size()).contains(&stub)
    });
    if !in_plt {
        return None;
    }
    let mut decoder = decode_at(stub)?;
    let mut jump = decoder.decode();
    if jump.code() == Code::Endbr64 {
        jump = decoder.decode();
    }
    if jump.code() != Code::Jmp_rm64 || !jump.is_ip_rel_memory_operand() {
        return None;
    }
    let slot = jump.ip_rel_memory_address();
    let (_, reloc) = file.dynamic_relocations()?.find(|(at, _)| *at == slot)?;
    let object::RelocationTarget::Symbol(index) = reloc.target() else {
        return None;
    };
    let symbol = file.dynamic_symbol_table()?.symbol_by_index(index).ok()?;
    symbol.name().ok().map(|n| Thunk::Plt(n.to_string()))
}

/// The file offset of virtual address `vaddr`, from the segments.
pub fn vaddr_to_file_offset(file: &object::File<'_>, vaddr: u64) -> Option<u64> {
    file.segments().find_map(|seg| {
        let (file_start, file_size) = seg.file_range();
        let rel = vaddr.checked_sub(seg.address())?;
        // A crafted program header can put a segment anywhere (fuzzed).
        if rel < file_size {
            file_start.checked_add(rel)
        } else {
            None
        }
    })
}

pub fn is_libc(path: &Path) -> bool {
    let name = file_name(path);
    name.starts_with(b"libc.so") || (name.starts_with(b"libc-") && name.ends_with(b".so"))
}

pub(super) fn is_dynamic_loader(path: &Path) -> bool {
    file_name(path).starts_with(b"ld-")
}

pub(super) fn file_name(path: &Path) -> &[u8] {
    path.file_name().unwrap_or(path.as_os_str()).as_bytes()
}

/// Identity of a file: device and inode.
pub type FileId = (u64, u64);

pub fn file_id(path: &Path) -> Option<FileId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Parsed objects by file identity, shared across the processes of a trace.
#[derive(Default)]
pub struct ObjectCache {
    by_id: HashMap<FileId, Arc<ObjectInfo>>,
}

impl ObjectCache {
    pub fn get(&mut self, host: &Path) -> Option<(FileId, Arc<ObjectInfo>)> {
        let id = file_id(host)?;
        if let Some(info) = self.by_id.get(&id) {
            return Some((id, info.clone()));
        }
        let info = Arc::new(ObjectInfo::parse(host).ok()?);
        self.by_id.insert(id, info.clone());
        Some((id, info))
    }
}

/// The ELF header says 64-bit x86 (e_machine at byte 18): the loader
/// skips libraries of other architectures in its search directories.
pub(super) fn is_x86_64_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut header = [0u8; 20];
    open_regular(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .is_ok()
        && header.starts_with(b"\x7fELF")
        && header[4] == 2
        && u16::from_le_bytes([header[18], header[19]]) == 62
}

/// Most bytes of an ELF object read to find its symbols (debug builds of
/// large libraries reach a few hundred MiB).
pub const MAX_OBJECT_BYTES: u64 = 1 << 30;

/// Opens `path` for reading if it is a regular file: without blocking (a
/// FIFO), without taking a terminal (O_NOCTTY), checked with fstat.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Reads a regular file of at most `max` bytes. The files come from
/// processes' root directories, which their owners control: a FIFO would
/// block the tracer and /dev/zero would fill its memory, so anything but a
/// regular file is refused, opened without blocking.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = open_regular(path)?;
    let meta = file.metadata()?;
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {max} bytes"),
        ));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(max).read_to_end(&mut data)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_libc_names() {
        assert!(is_libc(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(is_libc(Path::new("/lib/libc-2.31.so")));
        assert!(!is_libc(Path::new("/usr/lib/libcrypto.so.3")));
        assert!(!is_libc(Path::new("/usr/lib/libc_malloc_debug.so.0")));
    }
    #[test]
    fn direct_jumps_to_another_entry_point_are_thunks() {
        let jemalloc = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        if !jemalloc.exists() {
            return; // cargo xtask setup installs it; the integration tests require it
        }
        let info = ObjectInfo::parse(jemalloc).expect("parse jemalloc");
        // Debian's build: operator new[] is `jmp operator new`, operator
        // delete is `jmp free@plt`, malloc is code.
        assert_eq!(
            info.thunks.get("_Znam"),
            Some(&Thunk::Direct("_Znwm".into()))
        );
        assert_eq!(info.thunks.get("_ZdaPv"), Some(&Thunk::Plt("free".into())));
        assert_eq!(info.thunks.get("malloc"), None);
        assert_eq!(info.soname.as_deref(), Some(OsStr::new("libjemalloc.so.2")));
    }
}
