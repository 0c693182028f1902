//! Address normalization (while the process lives) and symbolization with
//! blazesym (at report time, so processes that exited still get names).

use std::{
    collections::HashMap,
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized, Symbolizer};

use crate::{
    report::Frame,
    target::process::{host_path, Mapping},
};

/// Which file an object is: the same (device, inode) in every process that
/// maps it, whatever path or mount namespace it is seen through. A file
/// that could not be opened is known by its path only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ObjectKey {
    File { dev: u64, ino: u64 },
    Unopened(String),
}

/// A mapped object file, shared by every process that maps it and kept
/// open so it can be read after those processes exited or the file was
/// replaced on disk.
struct Object {
    key: ObjectKey,
    /// Path as the first process that mapped it saw it.
    path: String,
    file: Option<File>,
    /// Live processes (tracked here) that map it.
    users: u32,
    /// An interned frame refers to it: kept until the report.
    referenced: bool,
}

/// A return address turned into (module, file offset of `ip - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormFrame {
    /// Index into the object table (one entry per file, not per process);
    /// None when the address is in no mapped file (JIT code, or the maps
    /// changed or the process exited before we looked).
    pub module: Option<u32>,
    /// File offset in the module, or the raw address when `module` is None.
    pub offset: u64,
}

/// What is kept for a live process; dropped when it exits.
struct Proc {
    /// File-backed mappings, sorted by start.
    maps: Vec<Mapping>,
    /// The object of each mapping (same index as `maps`).
    objects: Vec<u32>,
    last_read: Option<Instant>,
    /// Reads inside MIN_REREAD_INTERVAL so far (see `refresh`).
    quick_reads: u32,
    generation: u64,
}

#[derive(Default)]
pub struct Modules {
    /// Slots freed by eviction are None and reused.
    objects: Vec<Option<Object>>,
    free: Vec<u32>,
    by_key: HashMap<ObjectKey, u32>,
    procs: HashMap<u32, Proc>,
    /// Source of `Proc::generation`: unique across pids and their reuse.
    generations: u64,
    /// Processes whose maps could not be read before they exited.
    unread: std::collections::BTreeSet<u32>,
}

/// Addresses outside every mapped file (JIT code) would otherwise make each
/// event re-read /proc/PID/maps.
const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(100);

/// A new process maps its libraries in its first milliseconds, so reads
/// soon after its exec must not block the next few: this many are free of
/// MIN_REREAD_INTERVAL (a short-lived process is gone 100 ms later).
const QUICK_READS: u32 = 8;

/// The path a mapping shows (one place to adapt if its type changes).
fn map_path(m: &Mapping) -> &str {
    m.path.as_str()
}

impl Modules {
    /// Re-reads /proc/PID/maps, rate-limited (MIN_REREAD_INTERVAL after
    /// the first QUICK_READS). Returns whether the maps were read (false
    /// too when the process is gone).
    pub fn refresh(&mut self, pid: u32) -> bool {
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.last_read
                .is_some_and(|t| t.elapsed() < MIN_REREAD_INTERVAL)
            {
                if p.quick_reads >= QUICK_READS {
                    return false;
                }
                p.quick_reads += 1;
            }
        }
        let Ok(text) = std::fs::read(format!("/proc/{pid}/maps")) else {
            self.note_unread(pid);
            return false;
        };
        let maps = crate::target::process::parse_maps(&text);
        if maps.is_empty() {
            self.note_unread(pid);
            return false; // a zombie: keep what we had
        }
        self.merge_maps(pid, maps);
        true
    }

    /// The maps could not be read: the process is gone (or going). Later
    /// samples of it do not try again before MIN_REREAD_INTERVAL.
    fn note_unread(&mut self, pid: u32) {
        self.unread.insert(pid);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.last_read = Some(Instant::now());
            p.quick_reads = QUICK_READS;
        }
    }

    /// Every process with maps kept here.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.procs.keys().copied()
    }

    /// Processes whose maps could not be read (again) because they had
    /// exited: addresses outside the maps read before have no names.
    pub fn unread(&self) -> &std::collections::BTreeSet<u32> {
        &self.unread
    }

    /// Merges freshly read maps into what is known for `pid`: known mappings
    /// that nothing new overlaps stay. A re-read is for a library loaded
    /// since (dlopen); if the process exec'ed meanwhile, events of its old
    /// image still in the ring buffer (the EXEC event comes after them,
    /// then `forget` clears the maps) are resolved with the old mappings,
    /// not with the new image's.
    fn merge_maps(&mut self, pid: u32, new: Vec<Mapping>) {
        let (old_maps, old_objects) = match self.procs.get_mut(&pid) {
            Some(p) => (std::mem::take(&mut p.maps), std::mem::take(&mut p.objects)),
            None => (Vec::new(), Vec::new()),
        };
        let mut merged: Vec<(Mapping, u32)> = Vec::with_capacity(new.len() + old_maps.len());
        let mut opened: HashMap<String, u32> = HashMap::new();
        for m in &new {
            // An unchanged mapping keeps its object: no open, no stat.
            let same = old_maps.iter().position(|o| o == m);
            let object = match same {
                Some(i) => old_objects[i],
                None => match opened.get(map_path(m)) {
                    Some(&o) => o,
                    None => {
                        let o = self.identify(pid, m);
                        opened.insert(map_path(m).to_string(), o);
                        o
                    }
                },
            };
            self.retain_object(object);
            merged.push((m.clone(), object));
        }
        for (o, &object) in old_maps.iter().zip(&old_objects) {
            if !new.iter().any(|n| n.start < o.end && o.start < n.end) {
                self.retain_object(object);
                merged.push((o.clone(), object));
            }
        }
        for &object in &old_objects {
            self.release_object(object);
        }
        merged.sort_by_key(|(m, _)| m.start);
        let (maps, objects): (Vec<Mapping>, Vec<u32>) = merged.into_iter().unzip();
        // Unchanged maps keep their generation: nothing to rebuild.
        if maps != old_maps {
            self.generations += 1;
        }
        let generation = self.generations;
        let p = self.procs.entry(pid).or_insert_with(|| Proc {
            maps: Vec::new(),
            objects: Vec::new(),
            last_read: None,
            quick_reads: 0,
            generation,
        });
        p.maps = maps;
        p.objects = objects;
        p.last_read = Some(Instant::now());
        p.generation = generation;
        self.unread.remove(&pid);
    }

    /// The object a mapping of `pid` shows: opened through
    /// /proc/PID/map_files (the very file mapped, even if deleted or
    /// replaced since), else through the process's root.
    fn identify(&mut self, pid: u32, m: &Mapping) -> u32 {
        let file = File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .or_else(|_| File::open(host_path(pid, map_path(m))))
            .ok();
        let key = match file.as_ref().and_then(|f| f.metadata().ok()) {
            Some(meta) => ObjectKey::File {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            None => ObjectKey::Unopened(map_path(m).to_string()),
        };
        if let Some(&i) = self.by_key.get(&key) {
            return i; // the file we opened now closes here
        }
        let object = Object {
            key: key.clone(),
            path: map_path(m).to_string(),
            file,
            users: 0,
            referenced: false,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.objects[i as usize] = Some(object);
                i
            }
            None => {
                self.objects.push(Some(object));
                (self.objects.len() - 1) as u32
            }
        };
        self.by_key.insert(key, i);
        i
    }

    fn retain_object(&mut self, i: u32) {
        if let Some(Some(o)) = self.objects.get_mut(i as usize) {
            o.users += 1;
        }
    }

    /// One process less maps object `i`: evicted (its file closed) when no
    /// live process maps it and no interned frame refers to it.
    fn release_object(&mut self, i: u32) {
        let Some(slot) = self.objects.get_mut(i as usize) else {
            return;
        };
        let Some(o) = slot else {
            return;
        };
        o.users = o.users.saturating_sub(1);
        if o.users == 0 && !o.referenced {
            self.by_key.remove(&o.key);
            *slot = None;
            self.free.push(i);
        }
    }

    /// Whether `addr` lies in a mapping known for `pid`.
    pub fn covers(&self, pid: u32, addr: u64) -> bool {
        self.find(pid, addr).is_some()
    }

    /// `refresh` without the rate limit.
    pub fn refresh_now(&mut self, pid: u32) -> bool {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.last_read = None;
        }
        self.refresh(pid)
    }

    /// The process exec'ed: its maps are read again at its next event
    /// (objects its interned frames refer to stay, for stacks of the old
    /// image).
    pub fn forget(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            let objects = std::mem::take(&mut p.objects);
            p.maps.clear();
            p.last_read = None;
            p.quick_reads = 0;
            for o in objects {
                self.release_object(o);
            }
        }
    }

    /// The process exited and its events are handled: everything kept
    /// for it goes; the objects its frames refer to stay.
    pub fn drop_process(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            for o in p.objects {
                self.release_object(o);
            }
        }
    }

    /// How many processes and objects are held (for --verbose and tests).
    pub fn held(&self) -> (usize, usize) {
        (self.procs.len(), self.by_key.len())
    }

    /// Changes each time `pid`'s maps are set (to rebuild what was built
    /// from older ones).
    pub fn generation(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |p| p.generation)
    }

    /// Sets `pid`'s maps as read elsewhere (the initial read of a target).
    pub fn set_maps(&mut self, pid: u32, maps: Vec<Mapping>) {
        self.forget(pid);
        self.merge_maps(pid, maps);
    }

    /// The process's file-backed mappings as last read.
    pub fn maps(&self, pid: u32) -> &[Mapping] {
        self.procs.get(&pid).map_or(&[], |p| p.maps.as_slice())
    }

    fn find_index(&self, pid: u32, addr: u64) -> Option<usize> {
        let maps = &self.procs.get(&pid)?.maps;
        let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
        maps.get(i).filter(|m| addr < m.end).map(|_| i)
    }

    fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let i = self.find_index(pid, addr)?;
        self.procs.get(&pid)?.maps.get(i)
    }

    /// Normalizes return addresses of process `pid`. Re-reads the maps once
    /// if an address is not covered (a library loaded after the last read).
    pub fn normalize(&mut self, pid: u32, return_addrs: &[u64]) -> Vec<NormFrame> {
        let uncovered = return_addrs
            .iter()
            .any(|&a| self.find(pid, a.saturating_sub(1)).is_none());
        if uncovered {
            self.refresh(pid);
        }
        return_addrs
            .iter()
            .map(|&ret| self.normalize_one(pid, ret.saturating_sub(1)))
            .collect()
    }

    fn normalize_one(&mut self, pid: u32, addr: u64) -> NormFrame {
        let found = self.find_index(pid, addr).and_then(|i| {
            let p = self.procs.get(&pid)?;
            Some((p.maps.get(i)?, *p.objects.get(i)?))
        });
        let Some((m, object)) = found else {
            return NormFrame {
                module: None,
                offset: addr,
            };
        };
        let offset = addr - m.start + m.offset;
        if let Some(Some(o)) = self.objects.get_mut(object as usize) {
            o.referenced = true;
        }
        NormFrame {
            module: Some(object),
            offset,
        }
    }

    pub fn path(&self, module: u32) -> &str {
        match self.objects.get(module as usize) {
            Some(Some(o)) => o.path.as_str(),
            _ => "[unknown]",
        }
    }

    fn open_path(&self, module: u32) -> Option<PathBuf> {
        let Some(Some(o)) = self.objects.get(module as usize) else {
            return None;
        };
        let file = o.file.as_ref()?;
        Some(PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())))
    }
}

/// Symbolizes every distinct frame once and answers per frame.
pub struct Names {
    names: HashMap<NormFrame, Vec<Arc<Frame>>>,
}

impl Names {
    pub fn resolve<'a>(
        modules: &Modules,
        frames: impl IntoIterator<Item = &'a NormFrame>,
    ) -> Names {
        let mut by_module: HashMap<Option<u32>, Vec<u64>> = HashMap::new();
        for f in frames {
            by_module.entry(f.module).or_default().push(f.offset);
        }
        let symbolizer = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build();
        let mut names = HashMap::new();
        for (module, mut offsets) in by_module {
            offsets.sort_unstable();
            offsets.dedup();
            let module_path = module.map_or("[unknown]", |m| modules.path(m));
            let resolved = module
                .and_then(|m| modules.open_path(m))
                .map(|path| resolve_file(&symbolizer, &path, module_path, &offsets))
                .unwrap_or_default();
            for (i, &offset) in offsets.iter().enumerate() {
                let frames = resolved
                    .get(i)
                    .cloned()
                    .unwrap_or_else(|| vec![unknown(module_path, offset)]);
                names.insert(
                    NormFrame { module, offset },
                    frames.into_iter().map(Arc::new).collect(),
                );
            }
        }
        Names { names }
    }

    /// The frames for one address, innermost (inlined) first.
    pub fn get(&self, f: &NormFrame) -> &[Arc<Frame>] {
        self.names.get(f).map_or(&[], Vec::as_slice)
    }
}

/// The frames of each file offset in the ELF file at `path`, innermost
/// first (empty on errors: an unreadable file or not ELF degrade to
/// [unknown] frames).
fn resolve_file(
    symbolizer: &Symbolizer,
    path: &Path,
    module_path: &str,
    offsets: &[u64],
) -> Vec<Vec<Frame>> {
    let src = Source::Elf(Elf::new(path));
    let Ok(resolved) = symbolizer.symbolize(&src, Input::FileOffset(offsets)) else {
        return Vec::new();
    };
    resolved
        .iter()
        .zip(offsets)
        .map(|(r, &offset)| match r {
            Symbolized::Sym(sym) => expand(sym, module_path, offset),
            _ => vec![unknown(module_path, offset)],
        })
        .collect()
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
                crate::target::elf::vaddr_to_file_offset(&file, sym.address()).expect("offset")
            })
            .collect();
        let symbolizer = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(false)
            .build();
        let frames = resolve_file(&symbolizer, &bin, "short", &offsets);
        let names: Vec<&str> = frames
            .iter()
            .map(|f| f.last().map_or("", |f| f.function.as_str()))
            .collect();
        assert_eq!(names, ["a", "b", "long_name"]);
        assert!(frames[2].last().is_some_and(|f| f.line.is_some()));
        let _ = std::fs::remove_dir_all(&dir);
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

    /// A pid that no process has (above the kernel's pid_max limit):
    /// files are then opened by their path.
    const NO_SUCH_PID: u32 = 1 << 23;

    /// This test process's own executable mapping, moved to `shift`.
    fn exe_mapping(shift: u64) -> Mapping {
        let text = std::fs::read("/proc/self/maps").expect("own maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
        let mut m = crate::target::process::parse_maps(&text)
            .into_iter()
            .find(|m| m.executable && std::path::Path::new(&m.path) == exe)
            .expect("an executable mapping of the test binary");
        m.start += shift;
        m.end += shift;
        m
    }

    #[test]
    fn processes_mapping_one_file_share_one_object_kept_while_frames_refer_to_it() {
        let mut modules = Modules::default();
        let me = std::process::id();
        let a = exe_mapping(0);
        let b = exe_mapping(0x1000_0000);
        modules.set_maps(me, vec![a.clone()]);
        modules.set_maps(NO_SUCH_PID, vec![b.clone()]);
        assert_eq!(modules.held(), (2, 1), "two processes, one file");
        // The same code at different addresses: the same (object, offset).
        let fa = modules.normalize(me, &[a.start + 0x101]);
        let fb = modules.normalize(NO_SUCH_PID, &[b.start + 0x101]);
        assert_eq!(fa, fb);
        assert!(fa[0].module.is_some());
        modules.drop_process(me);
        modules.drop_process(NO_SUCH_PID);
        assert_eq!(modules.held(), (0, 1), "an interned frame refers to it");
        assert_eq!(modules.path(fa[0].module.expect("module")), a.path);
        assert!(modules.open_path(fa[0].module.expect("module")).is_some());
    }

    #[test]
    fn an_object_no_process_maps_and_no_frame_refers_to_is_closed() {
        let mut modules = Modules::default();
        modules.set_maps(NO_SUCH_PID, vec![exe_mapping(0)]);
        assert_eq!(modules.held(), (1, 1));
        modules.drop_process(NO_SUCH_PID);
        assert_eq!(modules.held(), (0, 0));
        // Its slot is reused by the next file.
        modules.set_maps(NO_SUCH_PID + 1, vec![exe_mapping(0)]);
        assert_eq!(modules.objects.len(), 1);
    }

    #[test]
    fn exec_keeps_the_objects_of_old_frames_and_unchanged_maps_keep_their_generation() {
        let mut modules = Modules::default();
        let m = exe_mapping(0);
        modules.set_maps(NO_SUCH_PID, vec![m.clone()]);
        let old = modules.normalize(NO_SUCH_PID, &[m.start + 0x11]);
        modules.forget(NO_SUCH_PID);
        assert!(modules.maps(NO_SUCH_PID).is_empty());
        assert_eq!(modules.held().1, 1, "the old image's frame keeps it");
        modules.set_maps(NO_SUCH_PID, vec![m.clone()]);
        let generation = modules.generation(NO_SUCH_PID);
        modules.merge_maps(NO_SUCH_PID, vec![m.clone()]);
        assert_eq!(modules.generation(NO_SUCH_PID), generation);
        assert_eq!(modules.normalize(NO_SUCH_PID, &[m.start + 0x11]), old);
    }
}
