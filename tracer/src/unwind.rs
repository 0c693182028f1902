//! DWARF unwinding of copied user stacks (framehop), for binaries without
//! frame pointers. One framehop unwinder per process, built from the files
//! it maps; each file's unwind sections are parsed once and shared.

use std::{collections::HashMap, ops::Range, path::Path, sync::Arc};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _,
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use crate::target::Mapping;

/// Frames beyond this many are dropped and the stack marked truncated (the
/// kernel's frame-pointer walks stop at 127 here, perf_event_max_stack).
pub const MAX_FRAMES: usize = 256;

type Data = Arc<[u8]>;

/// The unwind-relevant parts of one ELF file.
struct Sections {
    /// PT_LOAD segments: (file offset range, vaddr) to compute load bias.
    loads: Vec<(Range<u64>, u64)>,
    text: Option<(Range<u64>, Data)>,
    eh_frame: Option<(Range<u64>, Data)>,
    eh_frame_hdr: Option<(Range<u64>, Data)>,
    debug_frame: Option<Data>,
    got: Option<Range<u64>>,
}

impl Sections {
    fn parse(data: &[u8]) -> Option<Sections> {
        let file = object::File::parse(data).ok()?;
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let bytes = s.uncompressed_data().ok()?;
            Some((s.address()..s.address() + s.size(), Data::from(&*bytes)))
        };
        Some(Sections {
            loads: file
                .segments()
                .map(|seg| {
                    let (off, size) = seg.file_range();
                    (off..off + size, seg.address())
                })
                .collect(),
            text: section(".text"),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|(_, d)| d),
            got: file
                .section_by_name(".got")
                .map(|s| s.address()..s.address() + s.size()),
        })
    }

    /// Load bias of a mapping of this file: actual address - stated address.
    fn bias(&self, m: &Mapping) -> Option<u64> {
        let (range, vaddr) = self.loads.iter().find(|(r, _)| r.contains(&m.offset))?;
        let svma = vaddr + (m.offset - range.start);
        Some(m.start.wrapping_sub(svma))
    }

    fn module_info(&self) -> ExplicitModuleSectionInfo<Data> {
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.as_ref().map(|(r, _)| r.clone()),
            text: self.text.as_ref().map(|(_, d)| d.clone()),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        }
    }
}

struct ProcessUnwinder {
    unwinder: UnwinderX86_64<Data>,
    cache: CacheX86_64,
    /// Address ranges the unwinder has modules for.
    covered: Vec<Range<u64>>,
}

/// The caller's registers at the allocator's return and its stack bytes.
pub struct Sample<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Copied from `sp` upwards.
    pub stack: &'a [u8],
}

#[derive(Debug, PartialEq, Eq)]
pub struct Unwound {
    /// `addrs[0]` is the IP (just after the call into the allocator); the
    /// rest are return addresses. All are symbolized at `addr - 1`.
    pub addrs: Vec<u64>,
    /// The walk ended before the root: the copied window ran out, an
    /// address had no unwind information, or MAX_FRAMES was reached.
    pub truncated: bool,
}

/// Statistics for `--verbose` and the benchmark.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnwindStats {
    pub stacks: u64,
    pub frames: u64,
    pub truncated: u64,
    pub nanos: u64,
}

#[derive(Default)]
pub struct Unwinders {
    /// Keyed by the path as seen from here (/proc/PID/root/...).
    files: HashMap<String, Option<Arc<Sections>>>,
    procs: HashMap<u32, ProcessUnwinder>,
    pub stats: UnwindStats,
}

impl Unwinders {
    /// Forgets a process's unwinder so the next sample rebuilds it from
    /// fresh maps (after a dlopen).
    pub fn invalidate(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Whether `addr` lies in a module the process's unwinder knows.
    pub fn covers(&self, pid: u32, addr: u64) -> bool {
        self.procs
            .get(&pid)
            .is_some_and(|p| p.covered.iter().any(|r| r.contains(&addr)))
    }

    pub fn unwind(&mut self, pid: u32, maps: &[Mapping], sample: &Sample<'_>) -> Unwound {
        let started = std::time::Instant::now();
        if !self.procs.contains_key(&pid) {
            let built = self.build(pid, maps);
            self.procs.insert(pid, built);
        }
        let result = match self.procs.get_mut(&pid) {
            Some(p) => walk(p, sample),
            None => Unwound {
                addrs: vec![sample.ip],
                truncated: true,
            },
        };
        self.stats.stacks += 1;
        self.stats.frames += result.addrs.len() as u64;
        self.stats.truncated += u64::from(result.truncated);
        self.stats.nanos += started.elapsed().as_nanos() as u64;
        result
    }

    fn build(&mut self, pid: u32, maps: &[Mapping]) -> ProcessUnwinder {
        let mut unwinder = UnwinderX86_64::new();
        let mut covered = Vec::new();
        let mut by_path: HashMap<&str, Vec<&Mapping>> = HashMap::new();
        for m in maps {
            by_path.entry(m.path.as_str()).or_default().push(m);
        }
        for (path, group) in by_path {
            let Some(exec) = group.iter().find(|m| m.executable) else {
                continue;
            };
            let Some(sections) = self.sections(pid, path) else {
                continue;
            };
            let Some(bias) = sections.bias(exec) else {
                continue;
            };
            let start = group.iter().map(|m| m.start).min().unwrap_or(exec.start);
            let end = group.iter().map(|m| m.end).max().unwrap_or(exec.end);
            unwinder.add_module(Module::new(
                path.to_string(),
                start..end,
                bias,
                sections.module_info(),
            ));
            covered.push(start..end);
        }
        ProcessUnwinder {
            unwinder,
            cache: CacheX86_64::new(),
            covered,
        }
    }

    fn sections(&mut self, pid: u32, path: &str) -> Option<Arc<Sections>> {
        let host = crate::target::host_path(pid, path);
        let key = host.display().to_string();
        self.files
            .entry(key)
            .or_insert_with(|| read_sections(&host))
            .clone()
    }
}

fn read_sections(path: &Path) -> Option<Arc<Sections>> {
    let data = std::fs::read(path).ok()?;
    Sections::parse(&data).map(Arc::new)
}

fn walk(p: &mut ProcessUnwinder, s: &Sample<'_>) -> Unwound {
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(s.sp).ok_or(())?).map_err(|_| ())?;
        let bytes = s.stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    };
    let regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
    let mut frames = p
        .unwinder
        .iter_frames(s.ip, regs, &mut p.cache, &mut read_stack);
    let mut addrs = Vec::new();
    loop {
        if addrs.len() == MAX_FRAMES {
            return Unwound {
                addrs,
                truncated: true,
            };
        }
        match frames.next() {
            Ok(Some(frame)) => addrs.push(frame_address(frame)),
            Ok(None) => {
                return Unwound {
                    addrs,
                    truncated: false,
                }
            }
            Err(_) => {
                return Unwound {
                    addrs,
                    truncated: true,
                }
            }
        }
    }
}

fn frame_address(frame: FrameAddress) -> u64 {
    frame.address()
}
