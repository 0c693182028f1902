//! Which objects of a process define allocator entry points, which of them
//! its calls reach, and what is hooked in each.
//!
//! The dynamic loader resolves a symbol to its first definition in load
//! order: the executable, then LD_PRELOAD objects, then the needed libraries
//! breadth first, then anything dlopen'ed. So the standard names (malloc,
//! free, ..., C++'s operator new and delete) are hooked in the first object
//! of that order that defines malloc and free, and only there: when an
//! executable or jemalloc defines malloc, glibc's malloc is not also counted
//! for the same calls. Allocator-specific names (jemalloc's mallocx family,
//! prefixed builds such as `_rjem_*` and `je_*`, tcmalloc's `tc_*`,
//! mimalloc's `mi_*`) do not collide with anything: they are hooked in every
//! object that defines them. Calls from one hooked function into another
//! (mimalloc's malloc into mi_malloc) count once: see `on_alloc_enter` in
//! tracer-ebpf.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ffi::{OsStr, OsString},
    os::unix::{
        ffi::{OsStrExt as _, OsStringExt as _},
        fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
    sync::{Arc, LazyLock},
};

use anyhow::Context as _;
use object::{
    read::elf::ElfFile64, Object as _, ObjectSection as _, ObjectSegment as _, ObjectSymbol as _,
};
use tracer_common::Role;

use crate::error::TraceError;

/// One entry point that can be hooked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    pub name: String,
    pub role: Role,
    /// A name that every allocator defines (C, POSIX, glibc, C++): hooked
    /// only where the dynamic loader resolves it.
    pub standard: bool,
}

/// The C and POSIX names, in the order the report lists them. The core
/// ones are listed for the chosen object even when it lacks them.
pub const CORE: &[(&str, Role)] = &[
    ("malloc", Role::Malloc),
    ("free", Role::Free),
    ("calloc", Role::Calloc),
    ("realloc", Role::Realloc),
    ("reallocarray", Role::ReallocArray),
    ("posix_memalign", Role::PosixMemalign),
    ("aligned_alloc", Role::AlignedAlloc),
    ("memalign", Role::Memalign),
    ("valloc", Role::Valloc),
    ("pvalloc", Role::Pvalloc),
];

/// C++ operators new and delete (Itanium mangling, 64-bit size_t). glibc's
/// libstdc++ implements them with malloc and free, which are hooked; an
/// allocator that defines them (jemalloc, tcmalloc, mimalloc) serves them
/// directly, so they are hooked in the object that also defines malloc.
const CXX: &[(&str, Role)] = &[
    ("_Znwm", Role::Malloc),
    ("_Znam", Role::Malloc),
    ("_ZnwmRKSt9nothrow_t", Role::Malloc),
    ("_ZnamRKSt9nothrow_t", Role::Malloc),
    ("_ZnwmSt11align_val_t", Role::Malloc),
    ("_ZnamSt11align_val_t", Role::Malloc),
    ("_ZnwmSt11align_val_tRKSt9nothrow_t", Role::Malloc),
    ("_ZnamSt11align_val_tRKSt9nothrow_t", Role::Malloc),
    ("_ZdlPv", Role::Free),
    ("_ZdaPv", Role::Free),
    ("_ZdlPvm", Role::Free),
    ("_ZdaPvm", Role::Free),
    ("_ZdlPvRKSt9nothrow_t", Role::Free),
    ("_ZdaPvRKSt9nothrow_t", Role::Free),
    ("_ZdlPvSt11align_val_t", Role::Free),
    ("_ZdaPvSt11align_val_t", Role::Free),
    ("_ZdlPvmSt11align_val_t", Role::Free),
    ("_ZdaPvmSt11align_val_t", Role::Free),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", Role::Free),
    ("_ZdaPvSt11align_val_tRKSt9nothrow_t", Role::Free),
];

/// jemalloc's non-standard API. Alignment and zeroing travel in `flags`
/// and do not change what is accounted: the requested size. xallocx
/// resizes in place and returns the resulting usable size.
const JEMALLOC_API: &[(&str, Role)] = &[
    ("mallocx", Role::Malloc),
    ("rallocx", Role::Realloc),
    ("xallocx", Role::Xallocx),
    ("dallocx", Role::Free),
    ("sdallocx", Role::Free),
];

/// Prefixes of jemalloc builds configured with --with-jemalloc-prefix:
/// `_rjem_` (Rust's tikv-jemalloc-sys) and `je_` (Redis's bundled copy).
const JEMALLOC_PREFIXES: &[&str] = &["_rjem_", "je_"];

/// The standard names a prefixed jemalloc also defines with its prefix.
const JEMALLOC_PREFIXED_C: &[(&str, Role)] = &[
    ("malloc", Role::Malloc),
    ("calloc", Role::Calloc),
    ("realloc", Role::Realloc),
    ("free", Role::Free),
    ("posix_memalign", Role::PosixMemalign),
    ("aligned_alloc", Role::AlignedAlloc),
    ("memalign", Role::Memalign),
    ("valloc", Role::Valloc),
];

/// gperftools' tcmalloc: `tc_*` (aliases of its malloc etc. where the
/// compiler allows, so counted once).
const TCMALLOC_API: &[(&str, Role)] = &[
    ("tc_malloc", Role::Malloc),
    ("tc_malloc_skip_new_handler", Role::Malloc),
    ("tc_calloc", Role::Calloc),
    ("tc_realloc", Role::Realloc),
    ("tc_free", Role::Free),
    ("tc_free_sized", Role::Free),
    ("tc_cfree", Role::Free),
    ("tc_memalign", Role::Memalign),
    ("tc_posix_memalign", Role::PosixMemalign),
    ("tc_valloc", Role::Valloc),
    ("tc_pvalloc", Role::Pvalloc),
    ("tc_new", Role::Malloc),
    ("tc_newarray", Role::Malloc),
    ("tc_new_nothrow", Role::Malloc),
    ("tc_newarray_nothrow", Role::Malloc),
    ("tc_new_aligned", Role::Malloc),
    ("tc_newarray_aligned", Role::Malloc),
    ("tc_new_aligned_nothrow", Role::Malloc),
    ("tc_newarray_aligned_nothrow", Role::Malloc),
    ("tc_delete", Role::Free),
    ("tc_deletearray", Role::Free),
    ("tc_delete_nothrow", Role::Free),
    ("tc_deletearray_nothrow", Role::Free),
    ("tc_delete_sized", Role::Free),
    ("tc_deletearray_sized", Role::Free),
    ("tc_delete_aligned", Role::Free),
    ("tc_deletearray_aligned", Role::Free),
    ("tc_delete_sized_aligned", Role::Free),
    ("tc_deletearray_sized_aligned", Role::Free),
    ("tc_delete_aligned_nothrow", Role::Free),
    ("tc_deletearray_aligned_nothrow", Role::Free),
];

/// mimalloc's public API (not the `mi_heap_*` functions, which take a heap
/// first). `mi_reallocf` also frees its argument when it fails; that
/// difference is not modelled.
const MIMALLOC_API: &[(&str, Role)] = &[
    ("mi_malloc", Role::Malloc),
    ("mi_zalloc", Role::Malloc),
    ("mi_malloc_aligned", Role::Malloc),
    ("mi_malloc_aligned_at", Role::Malloc),
    ("mi_zalloc_aligned", Role::Malloc),
    ("mi_zalloc_aligned_at", Role::Malloc),
    ("mi_new", Role::Malloc),
    ("mi_new_aligned", Role::Malloc),
    ("mi_new_nothrow", Role::Malloc),
    ("mi_new_aligned_nothrow", Role::Malloc),
    ("mi_calloc", Role::Calloc),
    ("mi_mallocn", Role::Calloc),
    ("mi_new_n", Role::Calloc),
    ("mi_calloc_aligned", Role::Calloc),
    ("mi_calloc_aligned_at", Role::Calloc),
    ("mi_realloc", Role::Realloc),
    ("mi_reallocf", Role::Realloc),
    ("mi_rezalloc", Role::Realloc),
    ("mi_realloc_aligned", Role::Realloc),
    ("mi_realloc_aligned_at", Role::Realloc),
    ("mi_rezalloc_aligned", Role::Realloc),
    ("mi_new_realloc", Role::Realloc),
    ("mi_reallocn", Role::ReallocArray),
    ("mi_recalloc", Role::ReallocArray),
    ("mi_reallocarray", Role::ReallocArray),
    ("mi_new_reallocn", Role::ReallocArray),
    ("mi_posix_memalign", Role::PosixMemalign),
    ("mi_aligned_alloc", Role::AlignedAlloc),
    ("mi_memalign", Role::Memalign),
    ("mi_valloc", Role::Valloc),
    ("mi_pvalloc", Role::Pvalloc),
    ("mi_free", Role::Free),
    ("mi_cfree", Role::Free),
    ("mi_free_size", Role::Free),
    ("mi_free_aligned", Role::Free),
    ("mi_free_size_aligned", Role::Free),
];

/// Every entry point, standard ones first.
pub static ENTRY_POINTS: LazyLock<Vec<EntryPoint>> = LazyLock::new(|| {
    let entry = |name: String, role, standard| EntryPoint {
        name,
        role,
        standard,
    };
    let mut all: Vec<EntryPoint> = CORE
        .iter()
        .chain(CXX)
        .chain(&[("cfree", Role::Free)])
        .map(|&(n, r)| entry(n.to_string(), r, true))
        .collect();
    for &(n, r) in JEMALLOC_API.iter().chain(TCMALLOC_API).chain(MIMALLOC_API) {
        all.push(entry(n.to_string(), r, false));
    }
    for prefix in JEMALLOC_PREFIXES {
        for &(n, r) in JEMALLOC_PREFIXED_C.iter().chain(JEMALLOC_API) {
            all.push(entry(format!("{prefix}{n}"), r, false));
        }
    }
    all
});

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
    needed: Vec<OsString>,
    runpath: Vec<OsString>,
    rpath: Vec<OsString>,
    soname: Option<OsString>,
    /// 64-bit x86: a library the loader could pick for this process.
    native: bool,
    /// What it is built for when not `native` ("32-bit I386"...).
    machine: String,
    /// Has a program interpreter (dynamically linked executable).
    interp: bool,
    /// Has a symbol table (not stripped).
    symbols: bool,
    /// Defines glibc's internal `__libc_malloc` (libc, or a static binary).
    glibc: bool,
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
            if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            info.glibc |= name == "__libc_malloc";
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
    fn kind(&self, path: &Path) -> &'static str {
        let has = |n: &str| self.defined.contains_key(n);
        if ["mallocx", "_rjem_mallocx", "je_mallocx"]
            .iter()
            .any(|n| has(n))
        {
            "jemalloc"
        } else if has("tc_malloc") {
            "tcmalloc"
        } else if has("mi_malloc") {
            "mimalloc"
        } else if is_libc(path) || self.glibc {
            "glibc"
        } else {
            "own"
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

fn is_dynamic_loader(path: &Path) -> bool {
    file_name(path).starts_with(b"ld-")
}

fn file_name(path: &Path) -> &[u8] {
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

/// `--allocator`: which object to hook instead of the detected one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Auto,
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc": the object of that kind.
    Kind(String),
    /// This file (as the process sees it).
    Path(PathBuf),
}

impl Choice {
    pub fn parse(s: &str) -> Choice {
        match s {
            "auto" => Choice::Auto,
            "glibc" | "jemalloc" | "tcmalloc" | "mimalloc" => Choice::Kind(s.to_string()),
            path => Choice::Path(PathBuf::from(path)),
        }
    }
}

/// One object to hook for a process, and what in it.
#[derive(Clone, Debug)]
pub struct Hooked {
    /// Path as the process sees it.
    pub path: PathBuf,
    /// Path to open from the tracer (/proc/PID/map_files/... for a running
    /// process: the very file it maps, even when deleted or replaced since).
    pub host_path: PathBuf,
    pub id: FileId,
    /// "glibc", "jemalloc", "tcmalloc", "mimalloc" or "own".
    pub kind: &'static str,
    /// The object the standard names resolve to.
    pub resolves_malloc: bool,
    /// Whether it is the executable itself.
    pub is_executable: bool,
    /// Entry points to hook, in table order.
    pub entry_points: Vec<EntryPoint>,
    /// What the file defines (offsets, sizes, thunks), parsed once.
    pub info: Arc<ObjectInfo>,
}

impl Hooked {
    /// "jemalloc (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2)".
    pub fn describe(&self) -> String {
        let kind = match (self.kind, self.is_executable) {
            ("own", true) => "the executable's own allocator",
            ("own", false) => "a library's own allocator",
            (k, _) => k,
        };
        format!("{kind} ({})", self.path.display())
    }
}

/// A program's objects in the dynamic loader's search order.
struct Candidate {
    path: PathBuf,
    host: PathBuf,
    id: FileId,
    info: Arc<ObjectInfo>,
}

/// What decides a process's objects: its root directory, its executable,
/// and the loader's environment variables. Paths are bytes throughout.
pub struct Program {
    /// "/" or /proc/PID/root.
    pub root: PathBuf,
    /// Executable path inside `root`.
    pub exe: PathBuf,
    pub ld_preload: Vec<PathBuf>,
    pub ld_library_path: Vec<PathBuf>,
    /// Where to open the executable from.
    pub exe_host: PathBuf,
    /// The process's file-backed executable mappings, when it runs: the
    /// path it shows and where to open it (/proc/PID/map_files/..., right
    /// even in a chroot or another mount namespace, and for a file deleted
    /// or replaced on disk since it was mapped). dlopen'ed objects are
    /// only found here.
    pub mapped: Option<Vec<(PathBuf, PathBuf)>>,
    /// ld.so.conf's directories, read once.
    conf_dirs: std::cell::OnceCell<Vec<PathBuf>>,
}

/// An object a running process maps, parsed.
struct MappedObject {
    path: PathBuf,
    host: PathBuf,
    id: FileId,
    info: Arc<ObjectInfo>,
}

impl Program {
    /// A program about to be started by this tracer, with its environment.
    /// A script is its interpreter.
    pub fn to_start(exe: &Path) -> Program {
        let var = |k| std::env::var_os(k).unwrap_or_default();
        let exe = interpreter(exe).unwrap_or_else(|| exe.to_path_buf());
        Program {
            root: PathBuf::from("/"),
            exe_host: exe.clone(),
            exe,
            ld_preload: split_list(var("LD_PRELOAD").as_bytes(), b" :"),
            ld_library_path: split_list(var("LD_LIBRARY_PATH").as_bytes(), b":;"),
            mapped: None,
            conf_dirs: std::cell::OnceCell::new(),
        }
    }

    /// A running process (or one that just exec'ed: its libraries may not
    /// be mapped yet, and are then found by the loader's rules).
    pub fn running(pid: u32) -> Result<Program, TraceError> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map_err(|e| crate::target::process::unreadable(pid, "exe", &e))?;
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let mut preload: &[u8] = b"";
        let mut library_path: &[u8] = b"";
        for var in environ.split(|&b| b == 0) {
            if let Some(v) = var.strip_prefix(b"LD_PRELOAD=") {
                preload = v;
            } else if let Some(v) = var.strip_prefix(b"LD_LIBRARY_PATH=") {
                library_path = v;
            }
        }
        let maps = std::fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mut mapped: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (m, file) in crate::target::process::parse_maps_files(&maps) {
            if m.executable && !mapped.iter().any(|(p, _)| *p == file) {
                let host =
                    PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
                mapped.push((file, host));
            }
        }
        Ok(Program {
            root: PathBuf::from(format!("/proc/{pid}/root")),
            exe_host: PathBuf::from(format!("/proc/{pid}/exe")),
            exe: crate::target::process::strip_deleted(exe.as_os_str().as_bytes()),
            ld_preload: split_list(preload, b" :"),
            ld_library_path: split_list(library_path, b":;"),
            mapped: Some(mapped),
            conf_dirs: std::cell::OnceCell::new(),
        })
    }

    /// A process that just exec'ed: its libraries may not be mapped yet,
    /// so they are found by the loader's rules alone.
    pub fn just_executed(pid: u32) -> Result<Program, TraceError> {
        let mut program = Program::running(pid)?;
        program.mapped = None;
        Ok(program)
    }

    fn host(&self, path: &Path) -> PathBuf {
        let mut p = self.root.clone().into_os_string();
        p.push(path.as_os_str());
        PathBuf::from(p)
    }

    /// The objects in the order the loader searches them for a symbol.
    /// For a running process these are the files it maps (opened through
    /// /proc/PID/map_files), each in its place in that order even when its
    /// path now names another file (a library upgraded on disk) or none.
    fn search_order(&self, cache: &mut ObjectCache) -> Vec<Candidate> {
        let mapped: Option<Vec<MappedObject>> = self.mapped.as_ref().map(|m| {
            m.iter()
                .filter_map(|(path, host)| {
                    let (id, info) = cache.get(host)?;
                    Some(MappedObject {
                        path: path.clone(),
                        host: host.clone(),
                        id,
                        info,
                    })
                })
                .collect()
        });
        let mapped = mapped.as_deref().filter(|m| !m.is_empty());
        let mut out: Vec<Candidate> = Vec::new();
        let mut seen: HashSet<FileId> = HashSet::new();
        let mut add = |(path, host): (PathBuf, PathBuf), out: &mut Vec<Candidate>| {
            let (id, info) = cache.get(&host)?;
            if !info.native || !seen.insert(id) {
                return None;
            }
            out.push(Candidate {
                path,
                host,
                id,
                info: info.clone(),
            });
            Some(())
        };
        // The executable: /proc/PID/exe is the mapped file whatever
        // happened to its path.
        add((self.exe.clone(), self.exe_host.clone()), &mut out);
        let exe_dir = parent(&self.exe);
        for p in &self.ld_preload {
            if let Some(found) = self.locate(p.as_os_str(), &exe_dir, &[], &[], mapped) {
                add(found, &mut out);
            }
        }
        // Breadth first over DT_NEEDED, starting from the executable.
        let mut queue: VecDeque<usize> = (0..out.len().min(1)).collect();
        while let Some(i) = queue.pop_front() {
            let c = &out[i];
            let (needed, dir, info) = (c.info.needed.clone(), parent(&c.path), c.info.clone());
            for name in needed {
                let found = self.locate(&name, &dir, &info.runpath, &info.rpath, mapped);
                if let Some(found) = found {
                    if add(found, &mut out).is_some() {
                        queue.push_back(out.len() - 1);
                    }
                }
            }
        }
        let Some(mapped) = mapped else {
            return out;
        };
        // Keep what the process really maps; what it maps beyond that was
        // loaded later (dlopen) and comes last.
        out.retain(|c| mapped.iter().any(|m| m.id == c.id));
        for m in mapped {
            if !is_dynamic_loader(&m.path) {
                add((m.path.clone(), m.host.clone()), &mut out);
            }
        }
        out
    }

    /// Where the loader finds `name` (a DT_NEEDED or LD_PRELOAD entry):
    /// (path as the process sees it, path to open). In a running process,
    /// the object it maps for that name: the loader loads a soname once,
    /// and a file replaced or deleted on disk since is still the mapped
    /// one. Otherwise the loader's search on disk.
    fn locate(
        &self,
        name: &OsStr,
        origin: &Path,
        runpath: &[OsString],
        rpath: &[OsString],
        mapped: Option<&[MappedObject]>,
    ) -> Option<(PathBuf, PathBuf)> {
        let on_disk = self.find_library(name, origin, runpath, rpath);
        let Some(mapped) = mapped else {
            return on_disk.map(|p| {
                let host = self.host(&p);
                (p, host)
            });
        };
        let disk_id = on_disk.as_ref().and_then(|p| file_id(&self.host(p)));
        let found = mapped
            .iter()
            .find(|m| disk_id.is_some_and(|id| id == m.id))
            .or_else(|| {
                if name.as_bytes().contains(&b'/') {
                    let file = Path::new(name).file_name().map(OsStr::as_bytes);
                    mapped
                        .iter()
                        .find(|m| m.path.as_os_str() == name)
                        .or_else(|| mapped.iter().find(|m| Some(file_name(&m.path)) == file))
                } else {
                    mapped.iter().find(|m| {
                        m.info.soname.as_deref() == Some(name)
                            || file_name(&m.path) == name.as_bytes()
                    })
                }
            })?;
        Some((found.path.clone(), found.host.clone()))
    }

    /// The loader's search for a DT_NEEDED or LD_PRELOAD name (ld.so(8)):
    /// DT_RPATH when there is no DT_RUNPATH, LD_LIBRARY_PATH, DT_RUNPATH,
    /// the ld.so.conf directories, then the defaults.
    fn find_library(
        &self,
        name: &OsStr,
        origin: &Path,
        runpath: &[OsString],
        rpath: &[OsString],
    ) -> Option<PathBuf> {
        if name.as_bytes().contains(&b'/') {
            return Some(PathBuf::from(name));
        }
        let expand = |d: &OsString| expand_origin(d.as_bytes(), origin.as_os_str().as_bytes());
        let mut dirs: Vec<PathBuf> = Vec::new();
        if runpath.is_empty() {
            dirs.extend(rpath.iter().map(expand));
        }
        dirs.extend(self.ld_library_path.iter().cloned());
        dirs.extend(runpath.iter().map(expand));
        dirs.extend(
            self.conf_dirs
                .get_or_init(|| ld_so_conf_dirs(&self.host(Path::new("/etc/ld.so.conf"))))
                .iter()
                .cloned(),
        );
        dirs.extend(
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib",
            ]
            .map(PathBuf::from),
        );
        dirs.into_iter()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| d.join(name))
            .find(|p| {
                let host = self.host(p);
                host.is_file() && is_x86_64_elf(&host)
            })
    }

    /// The objects to hook for this program.
    pub fn allocators(
        &self,
        cache: &mut ObjectCache,
        choice: &Choice,
    ) -> Result<Vec<Hooked>, TraceError> {
        let order = self.search_order(cache);
        let hooked = |c: &Candidate, resolves_malloc: bool| Hooked {
            path: c.path.clone(),
            host_path: c.host.clone(),
            id: c.id,
            kind: c.info.kind(&c.path),
            resolves_malloc,
            is_executable: c.path == self.exe,
            entry_points: ENTRY_POINTS
                .iter()
                .filter(|e| c.info.defined.contains_key(&e.name))
                .filter(|e| resolves_malloc || !e.standard)
                .cloned()
                .collect(),
            info: c.info.clone(),
        };
        let chosen = match choice {
            Choice::Auto => order.iter().find(|c| c.info.defines_malloc_and_free()),
            Choice::Kind(kind) => order.iter().find(|c| c.info.kind(&c.path) == kind),
            Choice::Path(path) => {
                let id = file_id(&self.host(path));
                order.iter().find(|c| Some(c.id) == id || c.path == *path)
            }
        };
        let Some(chosen) = chosen else {
            return Err(self.not_found(choice, &order, cache));
        };
        let mut out = vec![hooked(chosen, true)];
        if *choice == Choice::Auto {
            for c in order.iter().filter(|c| c.id != chosen.id) {
                let h = hooked(c, false);
                if !h.entry_points.is_empty() {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    fn not_found(
        &self,
        choice: &Choice,
        order: &[Candidate],
        cache: &mut ObjectCache,
    ) -> TraceError {
        let objects: Vec<String> = order
            .iter()
            .filter(|c| !c.info.defined.is_empty())
            .map(|c| format!("{} ({})", c.path.display(), c.info.kind(&c.path)))
            .collect();
        let allocator = match choice {
            // Nothing to choose from: say why, as without --allocator.
            _ if objects.is_empty() => return self.no_allocator(cache),
            Choice::Auto => return self.no_allocator(cache),
            Choice::Kind(k) => k.clone(),
            Choice::Path(p) => p.display().to_string(),
        };
        TraceError::AllocatorNotFound {
            allocator,
            exe: self.exe.display().to_string(),
            objects: objects.join(", "),
        }
    }

    /// Why no object of this program defines malloc and free, as far as
    /// its executable tells.
    fn no_allocator(&self, cache: &mut ObjectCache) -> TraceError {
        let exe = self.exe.display().to_string();
        match cache.get(&self.exe_host) {
            Some((_, info)) if !info.native => TraceError::NotX86_64 {
                exe,
                machine: info.machine.clone(),
            },
            Some((_, info)) if !info.interp && info.symbols => TraceError::OwnAllocator { exe },
            _ => TraceError::NoAllocator { exe },
        }
    }
}

/// The ELF header says 64-bit x86 (e_machine at byte 18): the loader
/// skips libraries of other architectures in its search directories.
fn is_x86_64_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut header = [0u8; 20];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .is_ok()
        && header.starts_with(b"\x7fELF")
        && header[4] == 2
        && u16::from_le_bytes([header[18], header[19]]) == 62
}

/// The interpreter of a `#!` script (`#!/usr/bin/env NAME` looks NAME up
/// in PATH), or None for anything else.
fn interpreter(script: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let mut words = line
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(OsStr::from_bytes);
    let first = PathBuf::from(words.next()?);
    if first.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.as_bytes().starts_with(b"-"))?;
        let paths = std::env::var_os("PATH")?;
        return std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file());
    }
    Some(first)
}

fn parent(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
}

/// `$ORIGIN` and `${ORIGIN}` in an rpath entry replaced by `origin`.
fn expand_origin(dir: &[u8], origin: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(dir.len());
    let mut rest = dir;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix(b"${ORIGIN}") {
            out.extend_from_slice(origin);
            rest = r;
        } else if let Some(r) = rest.strip_prefix(b"$ORIGIN") {
            out.extend_from_slice(origin);
            rest = r;
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

fn split_list(s: &[u8], seps: &[u8]) -> Vec<PathBuf> {
    s.split(|b| seps.contains(b))
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(OsStr::from_bytes(p)))
        .collect()
}

/// Directories listed in ld.so.conf and the files it includes.
fn ld_so_conf_dirs(conf: &Path) -> Vec<PathBuf> {
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

/// Most bytes of an ELF object read to find its symbols (debug builds of
/// large libraries reach a few hundred MiB).
const MAX_OBJECT_BYTES: u64 = 1 << 30;
/// Most bytes of an ld.so.conf file, and most files one include reads.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
const MAX_CONFIG_INCLUDES: usize = 256;

/// Reads a regular file of at most `max` bytes. The files come from
/// processes' root directories, which their owners control: a FIFO would
/// block the tracer and /dev/zero would fill its memory, so anything but a
/// regular file is refused, opened without blocking.
pub fn read_bounded(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
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

    fn program(exe: &str) -> Program {
        Program {
            root: PathBuf::from("/"),
            exe: exe.into(),
            ld_preload: Vec::new(),
            ld_library_path: Vec::new(),
            exe_host: PathBuf::from(exe),
            mapped: None,
            conf_dirs: std::cell::OnceCell::new(),
        }
    }

    #[test]
    fn recognises_libc_names() {
        assert!(is_libc(Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(is_libc(Path::new("/lib/libc-2.31.so")));
        assert!(!is_libc(Path::new("/usr/lib/libcrypto.so.3")));
        assert!(!is_libc(Path::new("/usr/lib/libc_malloc_debug.so.0")));
    }

    #[test]
    fn finds_glibc_allocator_offsets() {
        let mut cache = ObjectCache::default();
        let me = Program::running(std::process::id()).expect("inspect self");
        let hooked = me.allocators(&mut cache, &Choice::Auto).expect("glibc");
        let libc = &hooked[0];
        assert_eq!(libc.kind, "glibc");
        let info = ObjectInfo::parse(&libc.host_path).expect("read libc");
        assert_ne!(info.defined["malloc"], info.defined["free"]);
        assert!(!info.defined.contains_key("mallocx"));
        assert!(info
            .needed
            .iter()
            .any(|n| n.as_bytes().starts_with(b"ld-linux")));
    }

    #[test]
    fn entry_point_names_are_unique() {
        let mut names: Vec<&str> = ENTRY_POINTS.iter().map(|e| e.name.as_str()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(names.contains(&"_rjem_sdallocx") && names.contains(&"je_mallocx"));
    }

    #[test]
    fn a_plain_program_resolves_malloc_to_glibc_and_hooks_nothing_else() {
        let mut cache = ObjectCache::default();
        let hooked = program("/bin/sh")
            .allocators(&mut cache, &Choice::Auto)
            .expect("sh uses glibc");
        assert_eq!(hooked.len(), 1, "{hooked:?}");
        assert_eq!(hooked[0].kind, "glibc");
        assert!(hooked[0].resolves_malloc);
        let names: Vec<&str> = hooked[0]
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert!(names.contains(&"malloc") && names.contains(&"free"));
    }

    #[test]
    fn preload_comes_before_needed_libraries() {
        let jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
        if !Path::new(jemalloc).exists() {
            return; // cargo xtask setup installs it; the integration tests require it
        }
        let mut cache = ObjectCache::default();
        let mut p = program("/bin/sh");
        p.ld_preload = vec![jemalloc.into()];
        let hooked = p.allocators(&mut cache, &Choice::Auto).expect("resolve");
        assert_eq!(hooked[0].kind, "jemalloc");
        let names: Vec<&str> = hooked[0]
            .entry_points
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        for n in [
            "malloc", "mallocx", "rallocx", "xallocx", "sdallocx", "_Znwm",
        ] {
            assert!(names.contains(&n), "{n} in {names:?}");
        }
        // glibc defines no allocator-specific names: not hooked at all.
        assert_eq!(hooked.len(), 1, "{hooked:?}");
        // Overriding picks glibc instead.
        let forced = p
            .allocators(&mut cache, &Choice::Kind("glibc".into()))
            .expect("glibc is there");
        assert_eq!((forced.len(), forced[0].kind), (1, "glibc"));
        let missing = p.allocators(&mut cache, &Choice::Kind("mimalloc".into()));
        assert!(missing.is_err());
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

    #[test]
    fn origin_is_expanded_in_bytes() {
        let dir = expand_origin(b"$ORIGIN/../lib:${ORIGIN}", b"/opt/\xff");
        assert_eq!(dir.as_os_str().as_bytes(), b"/opt/\xff/../lib:/opt/\xff");
    }

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
