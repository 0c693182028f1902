//! Address normalization (while the process lives) and symbolization with
//! blazesym (at report time, so processes that exited still get names).

use std::{
    collections::HashMap,
    fs::File,
    os::fd::AsRawFd,
    path::PathBuf,
    time::{Duration, Instant},
};

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolized, Symbolizer};

use crate::{
    report::Frame,
    target::{host_path, Mapping},
};

/// A mapped object file, kept open so it can be read after its process
/// exited or the file was replaced on disk.
struct Module {
    /// Path as the traced process sees it.
    path: String,
    file: Option<File>,
}

/// A return address turned into (module, file offset of `ip - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormFrame {
    /// Index into the module table; None when the address is in no mapped
    /// file (JIT code, or the maps changed before we looked).
    pub module: Option<u32>,
    /// File offset in the module, or the raw address when `module` is None.
    pub offset: u64,
}

#[derive(Default)]
pub struct Modules {
    modules: Vec<Module>,
    by_key: HashMap<(u32, String), u32>,
    /// Per process: its file-backed mappings, sorted by start.
    maps: HashMap<u32, Vec<Mapping>>,
    last_read: HashMap<u32, Instant>,
    generations: HashMap<u32, u64>,
}

/// Addresses outside every mapped file (JIT code) would otherwise make each
/// event re-read /proc/PID/maps.
const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(100);

impl Modules {
    /// Re-reads /proc/PID/maps, at most every MIN_REREAD_INTERVAL. Returns
    /// whether the maps were read (false too when the process is gone).
    pub fn refresh(&mut self, pid: u32) -> bool {
        if self
            .last_read
            .get(&pid)
            .is_some_and(|t| t.elapsed() < MIN_REREAD_INTERVAL)
        {
            return false;
        }
        let Ok(text) = std::fs::read(format!("/proc/{pid}/maps")) else {
            return false;
        };
        let mut maps = crate::target::parse_maps(&text);
        if maps.is_empty() {
            return false; // a zombie: keep what we had
        }
        // Merge: known mappings that nothing new overlaps stay. A re-read
        // is for a library loaded since (dlopen); if the process exec'ed
        // meanwhile, events of its old image still in the ring buffer (the
        // EXEC event comes after them, then `forget` clears the maps) are
        // resolved with the old mappings, not with the new image's.
        if let Some(old) = self.maps.get(&pid) {
            let kept: Vec<Mapping> = old
                .iter()
                .filter(|o| !maps.iter().any(|n| n.start < o.end && o.start < n.end))
                .cloned()
                .collect();
            maps.extend(kept);
        }
        self.set_maps(pid, maps);
        true
    }

    /// Whether `addr` lies in a mapping known for `pid`.
    pub fn covers(&self, pid: u32, addr: u64) -> bool {
        self.find(pid, addr).is_some()
    }

    /// `refresh` without the rate limit.
    pub fn refresh_now(&mut self, pid: u32) -> bool {
        self.last_read.remove(&pid);
        self.refresh(pid)
    }

    /// The process exec'ed: its maps are read again at its next event
    /// (files already open stay, for stacks of the old image).
    pub fn forget(&mut self, pid: u32) {
        self.maps.remove(&pid);
        self.last_read.remove(&pid);
        self.by_key.retain(|k, _| k.0 != pid);
    }

    /// Changes each time `pid`'s maps are set (to rebuild what was built
    /// from older ones).
    pub fn generation(&self, pid: u32) -> u64 {
        self.generations.get(&pid).copied().unwrap_or(0)
    }

    pub fn set_maps(&mut self, pid: u32, mut maps: Vec<Mapping>) {
        *self.generations.entry(pid).or_default() += 1;
        maps.sort_by_key(|m| m.start);
        self.maps.insert(pid, maps);
        self.last_read.insert(pid, Instant::now());
    }

    /// The process's file-backed mappings as last read.
    pub fn maps(&self, pid: u32) -> &[Mapping] {
        self.maps.get(&pid).map_or(&[], Vec::as_slice)
    }

    fn find(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        let maps = self.maps.get(&pid)?;
        let i = maps.partition_point(|m| m.start <= addr).checked_sub(1)?;
        maps.get(i).filter(|m| addr < m.end)
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
        let Some(m) = self.find(pid, addr) else {
            return NormFrame {
                module: None,
                offset: addr,
            };
        };
        let offset = addr - m.start + m.offset;
        let (path, range) = (m.path.clone(), (m.start, m.end));
        let module = self.module_index(pid, path, range);
        NormFrame {
            module: Some(module),
            offset,
        }
    }

    /// The module of the file `pid` maps at `range`, opened on first use.
    fn module_index(&mut self, pid: u32, path: String, range: (u64, u64)) -> u32 {
        // Keyed by pid too: the same path may be a different file in another
        // mount namespace.
        let key = (pid, path);
        if let Some(&i) = self.by_key.get(&key) {
            return i;
        }
        // The mapping itself: the file the process runs even when it was
        // deleted or replaced on disk since, and whatever bytes its path
        // holds. The path is the fallback (map_files needs CAP_SYS_ADMIN).
        let (start, end) = range;
        let file = File::open(format!("/proc/{pid}/map_files/{start:x}-{end:x}"))
            .or_else(|_| File::open(host_path(pid, &key.1)))
            .ok();
        let i = self.modules.len() as u32;
        self.modules.push(Module {
            path: key.1.clone(),
            file,
        });
        self.by_key.insert(key, i);
        i
    }

    pub fn path(&self, module: u32) -> &str {
        self.modules
            .get(module as usize)
            .map_or("[unknown]", |m| m.path.as_str())
    }

    fn open_path(&self, module: u32) -> Option<PathBuf> {
        let file = self.modules.get(module as usize)?.file.as_ref()?;
        Some(PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())))
    }
}

/// Symbolizes every distinct frame once and answers per frame.
pub struct Names {
    names: HashMap<NormFrame, Vec<Frame>>,
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
            .enable_demangling(true)
            .build();
        let mut names = HashMap::new();
        for (module, mut offsets) in by_module {
            offsets.sort_unstable();
            offsets.dedup();
            let resolved = module
                .and_then(|m| symbolize_module(&symbolizer, modules, m, &offsets))
                .unwrap_or_default();
            for (i, &offset) in offsets.iter().enumerate() {
                let nf = NormFrame { module, offset };
                let module_path = module.map_or("[unknown]", |m| modules.path(m));
                let frames = match resolved.get(i) {
                    Some(Symbolized::Sym(sym)) => expand(sym, module_path, offset),
                    _ => vec![unknown(module_path, offset)],
                };
                names.insert(nf, frames);
            }
        }
        Names { names }
    }

    /// The frames for one address, innermost (inlined) first.
    pub fn get(&self, f: &NormFrame) -> Vec<Frame> {
        self.names.get(f).cloned().unwrap_or_default()
    }
}

fn symbolize_module<'s>(
    symbolizer: &'s Symbolizer,
    modules: &Modules,
    module: u32,
    offsets: &[u64],
) -> Option<Vec<Symbolized<'s>>> {
    let src = Source::Elf(Elf::new(modules.open_path(module)?));
    // Errors (unreadable file, not ELF) degrade to [unknown] frames.
    symbolizer.symbolize(&src, Input::FileOffset(offsets)).ok()
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
        function: name.to_string(),
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
