//! Symbolization with blazesym at report time (so processes that exited
//! still get names), of frames normalized by `modules.rs`, and demangling.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized, Symbolizer};

use super::{
    debug_files::{DebugFile, DebugInfo},
    debuginfod::Debuginfod,
    modules::{Modules, NormFrame},
    symtab::SymbolTable,
};
use crate::profile::Frame;

/// Symbolizes every distinct frame once and answers per frame. Kept for
/// the whole trace: a snapshot names only frames new since the last one
/// (a module id stays valid while frames refer to it, see
/// `ObjectTable::release`).
#[derive(Default)]
pub struct Names {
    names: HashMap<NormFrame, Vec<Arc<Frame>>>,
    /// DEBUGINFOD_URLS: where debug files not found locally are fetched.
    pub(super) debuginfod: Option<Debuginfod>,
    /// Modules named while their debug file was on its way: named again
    /// once it came (or did not). At most one entry per object.
    pub(super) provisional: HashSet<u32>,
    /// The final report: how long it may still wait for downloads, and
    /// what says a signal came (`wait_for_downloads`).
    pub(super) wait: Option<(Duration, fn() -> bool)>,
}

impl Names {
    /// Names that fetch debug files from `debuginfod` when one is given.
    pub fn new(debuginfod: Option<Debuginfod>) -> Names {
        Names {
            debuginfod,
            ..Names::default()
        }
    }

    /// From now on, naming waits for the debug files it asked for, at most
    /// `budget` in all, and not after `interrupted` says a signal came.
    pub fn wait_for_downloads(&mut self, budget: Duration, interrupted: fn() -> bool) {
        self.wait = Some((budget, interrupted));
    }

    pub fn resolve<'a>(
        modules: &Modules,
        frames: impl IntoIterator<Item = &'a NormFrame>,
    ) -> Names {
        let mut names = Names::default();
        names.add(modules, frames);
        names
    }

    /// Names the frames not named yet, and forgets those no stack holds
    /// any more (a folded process's own frames): the cache is bounded by
    /// the frames of the profile, not by every snapshot's.
    pub fn add<'a>(&mut self, modules: &Modules, frames: impl IntoIterator<Item = &'a NormFrame>) {
        let current: HashSet<NormFrame> = frames.into_iter().copied().collect();
        // Debug files of the objects of new frames are asked for first
        // (and waited for, at the final report); those that came since
        // the last snapshot have their objects' frames named again.
        let new = current.iter().filter(|f| !self.names.contains_key(f));
        let new: HashSet<u32> = new.filter_map(|f| f.module).collect();
        self.fetch(modules, new.into_iter());
        let renamed = self.arrived(modules);
        self.names
            .retain(|f, _| current.contains(f) && !f.module.is_some_and(|m| renamed.contains(&m)));
        let mut by_module: HashMap<Option<u32>, Vec<u64>> = HashMap::new();
        for f in &current {
            if !self.names.contains_key(f) {
                by_module.entry(f.module).or_default().push(f.offset);
            }
        }
        if by_module.is_empty() {
            return;
        }
        let symbolizer = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build();
        for (module, mut offsets) in by_module {
            if let Some(name) = module.and_then(|m| modules.jit_frames().name_of(m)) {
                for offset in offsets {
                    let frame = Frame {
                        function: name.to_string(),
                        ..unknown(super::modules::JIT_MODULE_PATH, offset)
                    };
                    self.names
                        .insert(NormFrame { module, offset }, vec![Arc::new(frame)]);
                }
                continue;
            }
            offsets.sort_unstable();
            offsets.dedup();
            let module_path =
                module.map_or("[unknown]", |m| modules.shown_as().get(modules.path(m)));
            let debug = module.and_then(|m| modules.objects().debug_info(m));
            let fetched = module.and_then(|m| self.fetched(modules, m));
            let resolved = module
                .and_then(|m| modules.objects().open_path(m))
                .map(|path| {
                    let object = Object {
                        path: &path,
                        shown: module_path,
                        debug,
                        fetched: fetched.as_deref(),
                    };
                    resolve_file(&symbolizer, &object, &offsets)
                })
                .unwrap_or_default();
            let build_id = debug.and_then(|d| d.build_id.clone());
            for (i, &offset) in offsets.iter().enumerate() {
                let mut frames = resolved
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| vec![unknown(module_path, offset)]);
                for f in &mut frames {
                    f.build_id.clone_from(&build_id);
                }
                self.names.insert(
                    NormFrame { module, offset },
                    frames.into_iter().map(Arc::new).collect(),
                );
            }
        }
    }

    /// Modules with a frame that nothing named.
    pub(super) fn unknown_modules(&self) -> impl Iterator<Item = u32> + '_ {
        self.names
            .iter()
            .filter(|(_, frames)| matches!(&frames[..], [f] if f.function == "[unknown]"))
            .filter_map(|(f, _)| f.module)
    }

    /// The frames for one address, innermost (inlined) first.
    pub fn get(&self, f: &NormFrame) -> &[Arc<Frame>] {
        self.names.get(f).map_or(&[], Vec::as_slice)
    }
}

/// An object to name frames in.
struct Object<'a> {
    /// Where to open it (the tracer's own open file).
    path: &'a Path,
    /// The path frames show.
    shown: &'a str,
    /// Its build id and separate debug file, when read.
    debug: Option<&'a DebugInfo>,
    /// Its debug file from a debuginfod server.
    fetched: Option<&'a DebugFile>,
}

/// The frames of each file offset in `object`, innermost first: from its
/// separate debug file first, then from the object itself (an unreadable
/// file or not ELF degrade to [unknown] frames).
fn resolve_file(symbolizer: &Symbolizer, object: &Object<'_>, offsets: &[u64]) -> Vec<Vec<Frame>> {
    // blazesym reads DWARF only of a file that carries no link it would
    // follow by itself, unconfined (see debug_files.rs); its `.dwp` lookup
    // is `/proc/self/fd/N.dwp`, which never exists.
    let from_debug_file = object
        .debug
        .and_then(|d| Some((d, d.debug_file.as_ref().or(object.fetched)?)))
        .map(|(d, debug)| {
            // A debug file has the object's addresses, not its layout.
            let vaddrs: Vec<u64> = offsets.iter().map(|&o| d.vaddr(o).unwrap_or(0)).collect();
            let mut elf = Elf::new(fd_path(&debug.file));
            elf.debug_syms = debug.dwarf;
            symbolizer
                .symbolize(&Source::Elf(elf), Input::VirtOffset(&vaddrs))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let mut elf = Elf::new(object.path);
    elf.debug_syms = object.debug.is_some_and(|d| d.own_dwarf);
    let resolved = symbolizer
        .symbolize(&Source::Elf(elf), Input::FileOffset(offsets))
        .unwrap_or_default();
    // Read only when blazesym left a frame unnamed (it fails on a name
    // that is not UTF-8: see symtab.rs).
    let mut table: Option<Option<SymbolTable>> = None;
    let shown = object.shown;
    offsets
        .iter()
        .enumerate()
        .map(
            |(i, &offset)| match (from_debug_file.get(i), resolved.get(i)) {
                (Some(Symbolized::Sym(sym)), _) | (_, Some(Symbolized::Sym(sym))) => {
                    expand(sym, shown, offset)
                }
                _ => {
                    let table = table.get_or_insert_with(|| SymbolTable::read(object.path));
                    match table.as_ref().and_then(|t| t.name_at(offset)) {
                        Some(name) => vec![Frame {
                            function: demangle(name),
                            ..unknown(shown, offset)
                        }],
                        None => vec![unknown(shown, offset)],
                    }
                }
            },
        )
        .collect()
}

/// A path that opens the very file `file` has open.
fn fd_path(file: &std::fs::File) -> std::path::PathBuf {
    use std::os::fd::AsRawFd as _;
    std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Demangles Rust and C++ symbol names. Only names that are mangled are
/// tried: blazesym 0.2.7 hands every name of unknown language to the C++
/// demangler, which reads a C function `a` as the type code for `signed
/// char` (and `b` as `bool`, `f` as `float`...), so its demangling is off.
fn demangle(name: &str) -> String {
    if name.starts_with("_R") || name.starts_with("_ZN") {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            return format!("{d:#}");
        }
    }
    if name.starts_with("_Z") {
        if let Some(d) = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle().ok())
        {
            return d;
        }
    }
    name.to_string()
}

fn unknown(module: &str, offset: u64) -> Frame {
    Frame {
        function: "[unknown]".into(),
        module: module.into(),
        offset,
        ..Frame::default()
    }
}

/// One symbol with inlined calls `f -> g -> h` becomes frames `h, g, f`
/// (leaf first). Each frame carries the source location inside itself.
fn expand(sym: &blazesym::symbolize::Sym<'_>, module: &str, offset: u64) -> Vec<Frame> {
    let frame = |name: &str, info: Option<&blazesym::symbolize::CodeInfo<'_>>, inlined| Frame {
        function: demangle(name),
        module: module.to_string(),
        offset,
        file: info.map(|i| i.to_path().display().to_string()),
        line: info.and_then(|i| i.line),
        inlined,
        build_id: None,
    };
    // blazesym gives each level the location inside that level: the outer
    // function's line is its call to the first inlined one, and so on.
    let mut out = Vec::with_capacity(sym.inlined.len() + 1);
    for inl in sym.inlined.iter().rev() {
        out.push(frame(&inl.name, inl.code_info.as_ref(), true));
    }
    out.push(frame(&sym.name, sym.code_info.as_deref(), false));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_frames_no_stack_holds_any_more_are_forgotten() {
        let modules = Modules::default();
        let at = |offset| NormFrame {
            module: None,
            offset,
        };
        let mut names = Names::default();
        names.add(&modules, &[at(0x10), at(0x20)]);
        assert_eq!(names.get(&at(0x10))[0].display_name(), "[unknown]+0x10");
        names.add(&modules, &[at(0x20)]);
        assert!(names.get(&at(0x10)).is_empty(), "forgotten");
        assert_eq!(names.get(&at(0x20)).len(), 1);
    }

    #[test]
    fn one_letter_c_function_names_are_not_demangled_as_types() {
        // blazesym's demangling turned the C function `a` into "signed
        // char" and `b` into "bool" (Itanium type codes).
        let dir = std::env::temp_dir().join(format!("memtrace-short-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let src = dir.join("short.c");
        std::fs::write(
            &src,
            "#include <stdlib.h>\nvoid *volatile k; signed char sc; _Bool bo;\n\
             __attribute__((noinline)) void a(int n) { k = malloc(n); sc = n; }\n\
             __attribute__((noinline)) void b(int n) { a(n); k = 0; bo = n; }\n\
             __attribute__((noinline)) void long_name(int n) { b(n); k = 0; }\n\
             int main(int c, char **v) { long_name(c); (void)v; return 0; }\n",
        )
        .expect("write");
        let bin = dir.join("short");
        let ok = std::process::Command::new("cc")
            .args(["-O2", "-g", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("cc (cargo xtask setup installs it)");
        assert!(ok.success());
        let data = std::fs::read(&bin).expect("read");
        let file = object::File::parse(&*data).expect("ELF");
        let offsets: Vec<u64> = ["a", "b", "long_name"]
            .iter()
            .map(|n| {
                use object::{Object as _, ObjectSymbol as _};
                let sym = file.symbols().find(|s| s.name() == Ok(n)).expect("symbol");
                crate::tracee::elf::vaddr_to_file_offset(&file, sym.address()).expect("offset")
            })
            .collect();
        let symbolizer = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build();
        let info = DebugInfo::read(&std::fs::File::open(&bin).expect("open"), None, "/short");
        assert!(
            info.own_dwarf,
            "no link of its own: blazesym reads its DWARF"
        );
        let object = Object {
            path: &bin,
            shown: "short",
            debug: Some(&info),
            fetched: None,
        };
        let frames = resolve_file(&symbolizer, &object, &offsets);
        let names: Vec<&str> = frames
            .iter()
            .map(|f| f.last().map_or("", |f| f.function.as_str()))
            .collect();
        assert_eq!(names, ["a", "b", "long_name"]);
        assert!(frames[2].last().is_some_and(|f| f.line.is_some()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `cc -O2` (no debug info, so the names come from the symbol table)
    /// of a program calling `marker_function`, renamed in the file with the
    /// bytes of `rename` (same length); the file offset of `marker_function`
    /// and of `main`.
    fn program_with_renamed_function(rename: &[u8]) -> (std::path::PathBuf, Vec<u64>) {
        const MARKER: &[u8] = b"marker_function";
        assert_eq!(rename.len(), MARKER.len());
        let dir = std::env::temp_dir().join(format!("memtrace-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let src = dir.join("p.c");
        std::fs::write(
            &src,
            "#include <stdlib.h>\nvoid *volatile k;\n\
             __attribute__((noinline)) void marker_function(int n) { k = malloc(n); }\n\
             int main(int c, char **v) { marker_function(c); (void)v; return 0; }\n",
        )
        .expect("write");
        let bin = dir.join("p");
        let ok = std::process::Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("cc (cargo xtask setup installs it)");
        assert!(ok.success());
        let mut data = std::fs::read(&bin).expect("read");
        let offsets: Vec<u64> = {
            use object::{Object as _, ObjectSymbol as _};
            let file = object::File::parse(&*data).expect("ELF");
            ["marker_function", "main"]
                .iter()
                .map(|n| {
                    let sym = file.symbols().find(|s| s.name() == Ok(n)).expect("symbol");
                    crate::tracee::elf::vaddr_to_file_offset(&file, sym.address()).expect("offset")
                })
                .collect()
        };
        let at: Vec<usize> = (0..data.len() - MARKER.len())
            .filter(|&i| &data[i..i + MARKER.len()] == MARKER)
            .collect();
        assert!(!at.is_empty(), "marker in the symbol table");
        for i in at {
            data[i..i + MARKER.len()].copy_from_slice(rename);
        }
        std::fs::write(&bin, &data).expect("write renamed");
        (bin, offsets)
    }

    #[test]
    fn a_name_that_is_not_utf8_is_shown_with_replacement_characters() {
        let (bin, offsets) = program_with_renamed_function(b"bad\xff\xfe_name_here");
        let symbolizer = Symbolizer::builder().enable_demangling(false).build();
        let object = Object {
            path: &bin,
            shown: "p",
            debug: None,
            fetched: None,
        };
        let frames = resolve_file(&symbolizer, &object, &offsets);
        let names: Vec<&str> = frames
            .iter()
            .map(|f| f.last().map_or("", |f| f.function.as_str()))
            .collect();
        assert_eq!(names, ["bad\u{fffd}\u{fffd}_name_here", "main"]);
        let _ = std::fs::remove_file(&bin);
    }

    #[test]
    fn only_mangled_names_are_demangled() {
        assert_eq!(demangle("a"), "a");
        assert_eq!(demangle("f"), "f");
        assert_eq!(demangle("Pc"), "Pc");
        assert_eq!(demangle("_Znwm"), "operator new(unsigned long)");
        assert_eq!(
            demangle("_ZN4core9panicking9panic_fmt17h5f1a6fd39197ad62E"),
            "core::panicking::panic_fmt"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
    }
}
