//! DWARF unwinding of copied user stacks (framehop), for binaries without
//! frame pointers. One framehop unwinder per process, built from the files
//! it maps and dropped when the process exits; each file's unwind sections
//! are parsed once, shared by every process that maps the file (keyed by
//! device and inode, not by path), and dropped a while after the last
//! process that maps it is gone (`cfi.rs`).

use std::{collections::HashMap, ops::Range, path::PathBuf, sync::Arc};

use framehop::{
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
    FrameAddress, Module, Unwinder as _,
};

use super::cfi::{Data, FileKey, SectionCache, Sections};
use super::trampolines::JitCode;
use crate::tracee::process::Mapping;

/// Frames beyond this many are dropped and the stack marked truncated (the
/// kernel's frame-pointer walks stop at 127 here, perf_event_max_stack).
pub const MAX_FRAMES: usize = 256;

struct ProcessUnwinder {
    unwinder: UnwinderX86_64<Data>,
    cache: CacheX86_64,
    /// Executable mappings of the files the unwinder has modules for.
    covered: Vec<Range<u64>>,
    /// The parsed files it uses: held here so the cache sees them in use.
    _files: Vec<Arc<Sections>>,
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
#[derive(Debug, Clone, Copy)]
pub struct UnwindStats {
    pub stacks: u64,
    /// Tables mode: kernel walks finished here from a stack copy.
    pub resumed: u64,
    /// Of those, walks whose copy did not reach the root (or was empty):
    /// the copy was too small for the frames above, or met code without
    /// unwind information.
    pub resumed_cut: u64,
    pub frames: u64,
    pub truncated: u64,
    pub nanos: u64,
    /// Complete stacks by how many stack bytes their unwinding read, in
    /// buckets of DEPTH_BUCKET bytes: what --stack-bytes must cover.
    pub depth_histogram: [u64; DEPTH_BUCKETS],
}

pub const DEPTH_BUCKET: usize = 256;
pub const DEPTH_BUCKETS: usize = tracer_common::MAX_STACK_BYTES / DEPTH_BUCKET;

impl Default for UnwindStats {
    fn default() -> Self {
        UnwindStats {
            stacks: 0,
            resumed: 0,
            resumed_cut: 0,
            frames: 0,
            truncated: 0,
            nanos: 0,
            depth_histogram: [0; DEPTH_BUCKETS],
        }
    }
}

impl UnwindStats {
    /// Smallest window (a multiple of DEPTH_BUCKET) that covered `quantile`
    /// of the complete stacks.
    pub fn depth_quantile(&self, quantile: f64) -> Option<usize> {
        let total: u64 = self.depth_histogram.iter().sum();
        if total == 0 {
            return None;
        }
        let want = (total as f64 * quantile).ceil() as u64;
        let mut seen = 0;
        self.depth_histogram.iter().enumerate().find_map(|(i, &n)| {
            seen += n;
            (seen >= want).then_some((i + 1) * DEPTH_BUCKET)
        })
    }
}

/// Which file a mapping shows, (device, inode), and a path that opens it
/// from here: the caller's (`Modules` holds every mapped file open), so
/// building an unwinder costs no path lookups and no re-read of the maps.
pub type FileOf<'a> = &'a dyn Fn(&Mapping) -> Option<(FileKey, PathBuf)>;

#[derive(Default)]
pub struct Unwinders {
    files: SectionCache,
    procs: HashMap<u32, ProcessUnwinder>,
    pub stats: UnwindStats,
}

impl Unwinders {
    /// Forgets a process's unwinder so the next sample rebuilds it from
    /// fresh maps (after a dlopen, an exec, or its exit).
    pub fn invalidate(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Drops parsed files that no process's unwinder holds and none took
    /// for UNUSED_FILE_TTL.
    pub fn evict_unused(&mut self) {
        self.files.evict_unused();
    }

    /// How many processes and parsed files are held (for tests, --verbose).
    pub fn held(&self) -> (usize, usize) {
        (self.procs.len(), self.files.held())
    }

    /// `jit`: the process's anonymous executable ranges (JIT code), which
    /// framehop crosses by the frame-pointer chain (V8, the JVM and .NET
    /// keep frame pointers there), but for CPython's trampolines among
    /// them, stepped by their known rule. `file_of` is asked only when
    /// the process's unwinder is (re)built.
    pub fn unwind(
        &mut self,
        pid: u32,
        maps: &[Mapping],
        jit: &JitCode,
        sample: &Sample<'_>,
        file_of: FileOf<'_>,
    ) -> Unwound {
        let started = std::time::Instant::now();
        if !self.procs.contains_key(&pid) {
            let built = self.build(maps, file_of);
            self.procs.insert(pid, built);
        }
        let (result, depth) = match self.procs.get_mut(&pid) {
            Some(p) => walk(p, jit, sample),
            None => (
                Unwound {
                    addrs: vec![sample.ip],
                    truncated: true,
                },
                0,
            ),
        };
        if !result.truncated {
            let bucket = (depth / DEPTH_BUCKET).min(DEPTH_BUCKETS - 1);
            self.stats.depth_histogram[bucket] += 1;
        }
        self.stats.stacks += 1;
        self.stats.frames += result.addrs.len() as u64;
        self.stats.truncated += u64::from(result.truncated);
        self.stats.nanos += started.elapsed().as_nanos() as u64;
        result
    }

    fn build(&mut self, maps: &[Mapping], file_of: FileOf<'_>) -> ProcessUnwinder {
        let mut unwinder = UnwinderX86_64::new();
        let mut covered = Vec::new();
        let mut files = Vec::new();
        let mut by_path: HashMap<&str, Vec<&Mapping>> = HashMap::new();
        for m in maps {
            by_path.entry(m.path.as_str()).or_default().push(m);
        }
        for (path, group) in by_path {
            let Some(exec) = group.iter().find(|m| m.executable) else {
                continue;
            };
            let Some(sections) = file_of(exec).and_then(|(key, at)| self.files.get(key, &at))
            else {
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
            files.push(sections.clone());
            // Return addresses must point into code: a data mapping of the
            // same file does not make a garbage value a frame.
            covered.extend(
                group
                    .iter()
                    .filter(|m| m.executable)
                    .map(|m| m.start..m.end),
            );
        }
        ProcessUnwinder {
            unwinder,
            cache: CacheX86_64::new(),
            covered,
            _files: files,
        }
    }
}

/// Unwinds one sample; also returns how many stack bytes it read.
fn walk(p: &mut ProcessUnwinder, jit: &JitCode, s: &Sample<'_>) -> (Unwound, usize) {
    let mut depth = 0;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(s.sp).ok_or(())?).map_err(|_| ())?;
        let bytes = s.stack.get(off..off.checked_add(8).ok_or(())?).ok_or(())?;
        depth = depth.max(off + 8);
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    };
    let mut regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
    let mut frame = FrameAddress::from_instruction_pointer(s.ip);
    let mut addrs = vec![s.ip];
    let truncated = loop {
        // framehop unwinds an address without a module by the frame-
        // pointer chain: right in JIT code (anonymous executable memory),
        // garbage elsewhere (the maps changed): stop there, unless a
        // trampoline was there before (`JitCode::retired`).
        let pc = frame.address().saturating_sub(1);
        let known = |r: &Range<u64>| r.contains(&pc);
        let mapped = p.covered.iter().any(known) || jit.ranges().iter().any(known);
        let trampoline = if mapped {
            jit.trampoline_at(pc)
        } else {
            jit.retired_at(pc)
        };
        if !mapped && trampoline.is_none() || addrs.len() == MAX_FRAMES {
            break true;
        }
        let next = match trampoline {
            Some(t) => trampoline_step(
                t.shape.cfa_offset(pc - t.range.start),
                &mut regs,
                &mut read_stack,
            ),
            None => p
                .unwinder
                .unwind_frame(frame, &mut regs, &mut p.cache, &mut read_stack)
                .map_err(|_| ()),
        };
        match next {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                Some(f) => {
                    addrs.push(ra);
                    frame = f;
                }
                None => break true,
            },
            Ok(None) => break false,
            Err(()) => break true,
        }
    };
    (Unwound { addrs, truncated }, depth)
}

/// A step out of a CPython trampoline (`trampolines.rs`): the return
/// address is at CFA - 8, the CFA is RSP + `cfa_offset`, RBP untouched.
fn trampoline_step(
    cfa_offset: u64,
    regs: &mut UnwindRegsX86_64,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, ()> {
    let cfa = regs.sp().checked_add(cfa_offset).ok_or(())?;
    let ra = read_stack(cfa - 8)?;
    regs.set_sp(cfa);
    Ok(Some(ra))
}

/// Writes one sample as a JSON line: the maps, registers, stack bytes (hex)
/// and the unwinder's answer. Best effort: a developer aid.
pub fn record_sample(out: &mut impl std::io::Write, maps: &[Mapping], s: &Sample<'_>, u: &Unwound) {
    let hex: String = s.stack.iter().map(|b| format!("{b:02x}")).collect();
    let maps: Vec<_> = maps
        .iter()
        .map(|m| serde_json::json!({"start": m.start, "end": m.end, "offset": m.offset, "executable": m.executable, "path": m.path}))
        .collect();
    let line = serde_json::json!({
        "maps": maps, "ip": s.ip, "sp": s.sp, "bp": s.bp, "stack": hex,
        "addrs": u.addrs, "truncated": u.truncated,
    });
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
mod tests;
