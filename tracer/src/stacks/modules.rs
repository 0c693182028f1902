//! Address normalization while a process lives, and one open file per
//! mapped object, so `symbolize.rs` names frames after processes exited.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use super::jit::{JitNames, JitStats, JitSymbols};
use super::trampolines::JitCode;
use super::{
    debug_files::DebugInfo,
    roots::{open_in_root, open_mapped, path_in_root, Root, Roots},
};
use crate::tracee::process::Mapping;

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
    /// The root of the first process that mapped it (None: ours), and
    /// `path` as seen inside it: where its debug files are looked for.
    root: Root,
    path_in_root: String,
    /// Build id and debug file, read the first time a frame is named.
    debug: OnceLock<DebugInfo>,
    /// (device, inode) as the maps of the process it was opened for show
    /// it, when it was opened through /proc/PID/map_files and its fstat
    /// gives the same (`maps_form`): its entry in `Modules::by_maps_id`.
    maps_id: Option<(u64, u64)>,
}

/// A return address turned into (module, file offset of `ip - 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormFrame {
    /// Index into the object table (one entry per file, not per process),
    /// or from `jit::JIT_MODULE` up a JIT function's name (`jit_name`);
    /// None when the address is in no mapped file and has no JIT name (or
    /// the maps changed or the process exited before we looked).
    pub module: Option<u32>,
    /// File offset in the module, offset in the JIT function, or the raw
    /// address when `module` is None.
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
    /// Anonymous executable mappings (JIT code) and the CPython
    /// trampolines among them, for the walkers.
    jit: JitCode,
    /// Names of its JIT code (perf map, jitdump), read when first needed.
    jit_symbols: JitSymbols,
    /// Reads that found an address range holding other code than before
    /// (a library unloaded and another loaded in its place): addresses
    /// interned before mean other code now (`remaps`).
    remaps: u64,
    /// Addresses where a kernel walk ended early under the maps as last
    /// read (`walk_ended_at`); at most MAX_ENDED_AT, cleared when the
    /// executable maps change.
    ended_at: HashSet<u64>,
    /// The code generation the maps were read at (code_history.rs).
    code: CodeHistory,
}

impl Proc {
    /// A process with nothing read yet.
    fn new(generation: u64) -> Proc {
        Proc {
            maps: Vec::new(),
            objects: Vec::new(),
            last_read: None,
            quick_reads: 0,
            generation,
            jit: JitCode::default(),
            jit_symbols: JitSymbols::default(),
            remaps: 0,
            ended_at: HashSet::new(),
            code: CodeHistory::default(),
        }
    }
}

/// Addresses kept per process where kernel walks ended early.
const MAX_ENDED_AT: usize = 4096;

#[derive(Default)]
pub struct Modules {
    /// Slots freed by eviction are None and reused.
    objects: Vec<Option<Object>>,
    free: Vec<u32>,
    by_key: HashMap<ObjectKey, u32>,
    /// Objects by the (device, inode) that /proc/PID/maps shows for them,
    /// so that another process mapping the same file costs no open and no
    /// stat. Sound because the object holds the file open: its inode
    /// cannot be freed and its number reused while the entry lives. At
    /// most one entry per object (bounded as `objects` is), removed when
    /// the object is evicted.
    by_maps_id: HashMap<(u64, u64), u32>,
    procs: crate::hashing::FastMap<u32, Proc>,
    /// Source of `Proc::generation`: unique across pids and their reuse.
    generations: u64,
    /// Processes whose maps could not be read before they exited.
    unread: std::collections::BTreeSet<u32>,
    /// Executables shown under the name they were invoked by (a symbolic
    /// link to them: --binary LINK, or a process's argv[0]).
    pub shown_as: super::shown_as::ShownAs,
    /// `--unwind tables`: every process's maps described to the kernel.
    pub kernel: Option<super::kernel_tables::KernelTables>,
    /// Processes' root directories, shared by the objects seen in them.
    roots: Roots,
    /// Names of the JIT frames that stacks hold (module ids from JIT_MODULE).
    jit_names: JitNames,
    pub jit_stats: JitStats,
    /// `--unwind tables`: the path and rows of the largest file whose
    /// table did not fit (named when the kernel tables first report it,
    /// while a process maps it). One entry.
    largest_unfit: Option<(String, u32)>,
    /// The kernel side's code generations (None in the tests that do not
    /// need them: stacks are then named from the maps as read).
    pub code_gens: Option<Box<dyn CodeGens>>,
    pub code_stats: CodeStats,
}

/// Stacks with frames left unnamed because other code was mapped at
/// their address after the stack was taken, before the maps were read;
/// and stacks older than the kernel side's history of mappings reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeStats {
    pub replaced: u64,
    pub beyond_history: u64,
}

/// Else each event at an address in no mapped file (JIT code) re-reads maps.
const MIN_REREAD_INTERVAL: Duration = Duration::from_millis(100);

/// The same for the read at once after a kernel walk first ended at an
/// address (`walk_ended_at`): else a process whose walks end at ever new
/// addresses costs a read, a merge and a kernel sync per event.
const MIN_WALK_REREAD_INTERVAL: Duration = Duration::from_millis(10);

/// A new process maps its libraries in its first milliseconds, so reads
/// soon after its exec must not block the next few: this many are free of
/// MIN_REREAD_INTERVAL (a short-lived process is gone 100 ms later).
const QUICK_READS: u32 = 8;

/// The module JIT frames show, like the bracketed names /proc/PID/maps
/// gives memory that is no file (`[vdso]`, `[heap]`): the same in every
/// process, so one program's processes share their JIT frames.
pub const JIT_MODULE_PATH: &str = "[jit]";

/// A path that opens the very file `file` has open.
fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Where a mapping's file would start in memory: a file mapped again at
/// the same place (split by mprotect, say) keeps it.
fn load_bias(m: &Mapping) -> u64 {
    m.start.wrapping_sub(m.offset)
}

/// A file's (device, inode) as /proc/PID/maps would show them: the kernel
/// prints MAJOR:MINOR of the device, read back as major << 32 | minor
/// (`process::parse_dev`); stat gives the device encoded otherwise.
fn maps_form(meta: &std::fs::Metadata) -> (u64, u64) {
    let dev = meta.dev();
    (
        u64::from(libc::major(dev)) << 32 | u64::from(libc::minor(dev)),
        meta.ino(),
    )
}

/// The executable mappings of a process and their objects.
fn code<'a>(
    maps: &'a [Mapping],
    objects: &'a [u32],
) -> impl Iterator<Item = (&'a Mapping, &'a u32)> {
    maps.iter().zip(objects).filter(|(m, _)| m.executable)
}

/// The path a mapping shows (one place to adapt if its type changes).
fn map_path(m: &Mapping) -> &str {
    m.path.as_str()
}

impl Modules {
    /// Re-reads /proc/PID/maps, rate-limited (MIN_REREAD_INTERVAL after
    /// the first QUICK_READS). Returns whether the maps were read (false
    /// too when the process is gone).
    pub fn refresh(&mut self, pid: u32) -> bool {
        self.refresh_within(pid, MIN_REREAD_INTERVAL)
    }

    /// `refresh` with `min_interval` in place of MIN_REREAD_INTERVAL.
    fn refresh_within(&mut self, pid: u32, min_interval: Duration) -> bool {
        if let Some(p) = self.procs.get_mut(&pid) {
            if p.last_read.is_some_and(|t| t.elapsed() < min_interval) {
                if p.quick_reads >= QUICK_READS {
                    return false;
                }
                p.quick_reads += 1;
            }
        }
        let Some((text, code)) = self.read_maps_text(pid) else {
            self.note_unread(pid);
            return false;
        };
        let maps = crate::tracee::process::parse_maps(&text);
        if maps.is_empty() {
            self.note_unread(pid);
            return false; // a zombie: keep what we had
        }
        let image_read = self.procs.get(&pid).is_some_and(|p| !p.maps.is_empty());
        self.merge_maps(pid, maps);
        if !image_read {
            self.shown_as.note_process(pid);
        }
        self.set_jit(pid, crate::tracee::process::parse_jit(&text));
        self.note_read(pid, code.as_ref());
        true
    }

    /// `pid`'s anonymous executable ranges as read now: the new ones are
    /// read for CPython's trampolines (`trampolines.rs`); if anything
    /// changed, they are described to the kernel's walker and the
    /// process's generation changes (a user-space walk that stopped in
    /// JIT code is done again).
    fn set_jit(&mut self, pid: u32, jit: Vec<std::ops::Range<u64>>) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.jit.update(pid, jit) {
            self.generations += 1;
            p.generation = self.generations;
            self.describe_to_kernel(pid);
        }
    }

    /// /proc/PID/maps and the code generation they show: read again (at
    /// most 3 times) while the process maps code meanwhile.
    fn read_maps_text(&self, pid: u32) -> Option<(Vec<u8>, Option<CodeMaps>)> {
        let current = |pid| self.code_gens.as_ref().and_then(|g| g.current(pid));
        let mut before = current(pid);
        let mut attempt = 0;
        loop {
            let text = std::fs::read(format!("/proc/{pid}/maps")).ok()?;
            let after = current(pid);
            attempt += 1;
            if after.map(|m| m.gen) == before.map(|m| m.gen) || attempt == 3 {
                return Some((text, after));
            }
            before = after;
        }
    }

    /// The maps of `pid` were read (and described to the kernel's walker)
    /// at `code`'s generation: tell the kernel side, whose walks trust the
    /// tables from then on.
    fn note_read(&mut self, pid: u32, code: Option<&CodeMaps>) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.code = CodeHistory::at_read(code);
        if let Some(gens) = &mut self.code_gens {
            gens.read_at(pid, p.code.read_gen());
        }
    }

    /// A stack of `pid` taken at code generation `gen`: if the process
    /// mapped code since its maps were read, they are read again (once
    /// per generation).
    pub fn observe(&mut self, pid: u32, gen: u32) {
        if self
            .procs
            .get_mut(&pid)
            .is_some_and(|p| p.code.wants_read(gen))
        {
            self.refresh_now(pid);
        }
    }

    /// Whether `addr` in a stack of `pid` taken at `gen` may be named from
    /// the maps as read (no code mapped over it since; see code_history.rs).
    pub fn sure(&self, pid: u32, addr: u64, gen: Option<u32>) -> bool {
        match (gen, self.procs.get(&pid)) {
            (Some(gen), Some(p)) => p.code.sure(addr, gen),
            _ => true,
        }
    }

    /// The maps could not be read (it is gone): no retry before MIN_REREAD_INTERVAL.
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
        // Known mappings that nothing new overlaps stay (cloned: the old
        // list is compared with the result below).
        for (o, &object) in old_maps.iter().zip(&old_objects) {
            if !new.iter().any(|n| n.start < o.end && o.start < n.end) {
                self.retain_object(object);
                merged.push((o.clone(), object));
            }
        }
        let mut opened: HashMap<String, u32> = HashMap::new();
        let mut replaced = false;
        for m in new {
            // An unchanged mapping keeps its object: no open, no stat.
            // Both lists are sorted by start.
            let at = old_maps.partition_point(|o| o.start < m.start);
            let same = old_maps
                .get(at..)
                .unwrap_or_default()
                .iter()
                .take_while(|o| o.start == m.start)
                .position(|o| *o == m)
                .map(|i| at + i);
            let object = match same {
                Some(i) => old_objects[i],
                None => match opened.get(map_path(&m)) {
                    Some(&o) => o,
                    None => {
                        let o = self.identify(pid, &m);
                        opened.insert(map_path(&m).to_string(), o);
                        o
                    }
                },
            };
            // Other code where known code was (a library unloaded and
            // another loaded in its place): a remap. Only code counts:
            // no return address lies in data, and a data file mapped where
            // another was (databases, locales) is common.
            replaced |= m.executable
                && old_maps.iter().zip(&old_objects).any(|(o, &old)| {
                    o.executable
                        && o.start < m.end
                        && m.start < o.end
                        && (old != object || load_bias(o) != load_bias(&m))
                });
            self.retain_object(object);
            merged.push((m, object));
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
        let p = self
            .procs
            .entry(pid)
            .or_insert_with(|| Proc::new(generation));
        p.remaps += u64::from(replaced);
        let changed = maps != old_maps || objects != old_objects;
        // Walks end in code only: data mapped or unmapped changes none.
        if !code(&maps, &objects).eq(code(&old_maps, &old_objects)) {
            p.ended_at.clear();
        }
        p.maps = maps;
        p.objects = objects;
        p.last_read = Some(Instant::now());
        p.generation = generation;
        self.unread.remove(&pid);
        if changed {
            self.describe_to_kernel(pid);
        }
    }

    /// `--unwind tables`, about every second: kept tables unused for
    /// their TTL go, and the processes using a file whose table waited
    /// for rows that can be had now are described again (which loads it).
    pub fn tick_tables(&mut self, now: Instant) {
        let Some(kernel) = &mut self.kernel else {
            return;
        };
        kernel.expire_unused(now);
        for pid in kernel.waiting(now) {
            self.describe_to_kernel(pid);
        }
    }

    /// A kernel walk of `pid` ended early at `pc` (a frame it could not
    /// follow): the table used there may be that of a library unloaded
    /// since, with another loaded at its addresses (dlclose, dlopen). The
    /// first time a walk ends at `pc` under the maps as last read, they
    /// are read again soon (at most every MIN_WALK_REREAD_INTERVAL; a
    /// change describes the new code to the kernel); later times, at most
    /// as often as `refresh` allows, so that code no walk can cross costs
    /// no read per event.
    pub fn walk_ended_at(&mut self, pid: u32, pc: u64) {
        let first = self
            .procs
            .get_mut(&pid)
            .is_some_and(|p| p.ended_at.len() < MAX_ENDED_AT && p.ended_at.insert(pc));
        if !first {
            self.refresh(pid);
        } else if !self.refresh_within(pid, MIN_WALK_REREAD_INTERVAL) {
            // Not read: its next end at `pc` is a first one still.
            if let Some(p) = self.procs.get_mut(&pid) {
                p.ended_at.remove(&pc);
            }
        }
    }

    /// How many times `pid`'s maps were found to hold other code at an
    /// address range than before (see `Proc::remaps`).
    pub fn remaps(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |p| p.remaps)
    }

    /// `--unwind tables`: tells the kernel's walker about `pid`'s maps.
    fn describe_to_kernel(&mut self, pid: u32) {
        let Modules {
            kernel: Some(kernel),
            procs,
            objects,
            by_key,
            largest_unfit,
            ..
        } = self
        else {
            return;
        };
        let Some(p) = procs.get(&pid) else {
            return;
        };
        let open = |o: u32| match objects.get(o as usize) {
            Some(Some(Object {
                key: ObjectKey::File { dev, ino },
                file: Some(file),
                ..
            })) => Some(((*dev, *ino), fd_path(file))),
            _ => None,
        };
        kernel.sync(pid, &p.maps, &p.objects, &p.jit, open);
        if let Some(((dev, ino), rows)) = kernel.largest_unfit() {
            if largest_unfit.as_ref().is_none_or(|(_, r)| *r != rows) {
                let name = by_key
                    .get(&ObjectKey::File { dev, ino })
                    .and_then(|&i| objects.get(i as usize)?.as_ref())
                    .map_or_else(|| format!("device {dev} inode {ino}"), |o| o.path.clone());
                *largest_unfit = Some((name, rows));
            }
        }
    }

    /// `--unwind tables`: the path (as the first process that mapped it
    /// saw it: hostile, escape it) and rows of the largest file whose table
    /// did not fit.
    pub fn largest_unfit_table(&self) -> Option<(&str, u32)> {
        self.largest_unfit
            .as_ref()
            .map(|(name, rows)| (name.as_str(), *rows))
    }

    /// The object a mapping of `pid` shows: opened through
    /// /proc/PID/map_files (the very file mapped, even if deleted or
    /// replaced since), else through the process's root.
    fn identify(&mut self, pid: u32, m: &Mapping) -> u32 {
        let maps_id = Some(m.dev_inode).filter(|&(_, inode)| inode != 0);
        if let Some(&i) = maps_id.and_then(|id| self.by_maps_id.get(&id)) {
            return i;
        }
        // Both opens refuse what is not a regular file (a device mapped, a
        // FIFO put where a mapped file was) before opening it, and the
        // path the maps show is resolved inside the process's root.
        let mapped = open_mapped(
            Path::new(&format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
            u64::MAX,
        );
        let very_file = mapped.is_ok();
        let mut rooted = None;
        let file = match mapped {
            Ok(file) => Some(file),
            Err(_) => {
                let (root, prefix) = self.roots.of(pid);
                let at = path_in_root(map_path(m), &prefix);
                let file = open_in_root(root.as_deref(), Path::new(&at), u64::MAX).ok();
                rooted = Some((root, prefix));
                file
            }
        };
        let meta = file.as_ref().and_then(|f| f.metadata().ok());
        // Only the very file mapped may be found again by the maps' id, and
        // only where that id is its own: btrfs shows the filesystem's
        // device for every subvolume, whose inode numbers repeat, so there
        // two files share an id and each is identified by its fstat.
        let maps_id = maps_id
            .filter(|&id| very_file && meta.as_ref().is_some_and(|meta| maps_form(meta) == id));
        let key = match meta {
            Some(meta) => ObjectKey::File {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            None => ObjectKey::Unopened(map_path(m).to_string()),
        };
        if let Some(&i) = self.by_key.get(&key) {
            // The file we opened now closes here.
            if let (Some(id), Some(Some(o))) = (maps_id, self.objects.get_mut(i as usize)) {
                if o.maps_id.is_none() && o.file.is_some() {
                    o.maps_id = Some(id);
                    self.by_maps_id.insert(id, i);
                }
            }
            return i;
        }
        let (root, prefix) = rooted.unwrap_or_else(|| self.roots.of(pid));
        let object = Object {
            key: key.clone(),
            path: map_path(m).to_string(),
            file,
            users: 0,
            referenced: false,
            root,
            path_in_root: path_in_root(map_path(m), &prefix),
            debug: OnceLock::new(),
            maps_id,
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
        if let Some(Some(Object {
            maps_id: Some(id), ..
        })) = self.objects.get(i as usize)
        {
            self.by_maps_id.insert(*id, i);
        }
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
            if let Some(id) = o.maps_id {
                self.by_maps_id.remove(&id);
            }
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
    /// image). Its JIT code goes too: else the first sync describes the
    /// old image's to the kernel's walker.
    pub fn forget(&mut self, pid: u32) {
        if let Some(kernel) = &mut self.kernel {
            kernel.drop_process(pid);
        }
        if let Some(p) = self.procs.get_mut(&pid) {
            let objects = std::mem::take(&mut p.objects);
            p.maps.clear();
            p.jit.clear();
            p.ended_at.clear();
            p.jit_symbols = JitSymbols::default();
            p.last_read = None;
            p.quick_reads = 0;
            p.code = CodeHistory::default();
            for o in objects {
                self.release_object(o);
            }
        }
    }

    /// `child` was forked from `parent`: fork copies the address space, so
    /// it maps what the parent maps, and takes the parent's maps and
    /// objects as they are (nothing read, opened or stat'ed). Whether the
    /// parent's maps were known.
    pub fn forked(&mut self, parent: u32, child: u32) -> bool {
        self.forget(child);
        let Some(p) = self.procs.get(&parent).filter(|p| !p.maps.is_empty()) else {
            return false;
        };
        let (maps, objects, jit) = (p.maps.clone(), p.objects.clone(), p.jit.clone());
        for &o in &objects {
            self.retain_object(o);
        }
        self.generations += 1;
        let generation = self.generations;
        let c = self
            .procs
            .entry(child)
            .or_insert_with(|| Proc::new(generation));
        c.maps = maps;
        c.objects = objects;
        c.jit = jit;
        c.last_read = Some(Instant::now());
        c.generation = generation;
        self.unread.remove(&child);
        self.describe_to_kernel(child);
        true
    }

    /// The process exited and its events are handled: everything kept
    /// for it goes; the objects its frames refer to stay.
    pub fn drop_process(&mut self, pid: u32) {
        if let Some(kernel) = &mut self.kernel {
            kernel.drop_process(pid);
        }
        if let Some(gens) = &mut self.code_gens {
            gens.forget(pid);
        }
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

    /// Changes each time `pid`'s maps (files or JIT code) are set (to
    /// rebuild what was built from older ones).
    pub fn generation(&self, pid: u32) -> u64 {
        self.procs.get(&pid).map_or(0, |p| p.generation)
    }

    /// Sets `pid`'s maps as read elsewhere (the initial read of a target,
    /// a forked child's parent's): its file mappings and its anonymous
    /// executable ones (JIT code), both described to the kernel's walker.
    /// Without the latter, every walk through JIT code of a process
    /// attached by --pid went back to user space until its maps were
    /// read again.
    pub fn set_maps(&mut self, pid: u32, maps: Vec<Mapping>, jit: Vec<std::ops::Range<u64>>) {
        self.forget(pid);
        self.merge_maps(pid, maps);
        self.shown_as.note_process(pid);
        self.set_jit(pid, jit);
        let code = self.code_gens.as_ref().and_then(|g| g.current(pid));
        self.note_read(pid, code.as_ref());
    }

    /// The process's anonymous executable mappings (JIT code) as last
    /// read, and the CPython trampolines among them.
    pub fn jit(&self, pid: u32) -> &JitCode {
        static NONE: JitCode = JitCode::EMPTY;
        self.procs.get(&pid).map_or(&NONE, |p| &p.jit)
    }

    /// The process's file-backed mappings as last read.
    pub fn maps(&self, pid: u32) -> &[Mapping] {
        self.procs.get(&pid).map_or(&[], |p| p.maps.as_slice())
    }

    /// The file mapping `m` of `pid` shows, as `describe_to_kernel` gives
    /// it: (device, inode) and a path to the copy held open here. None when
    /// `m` is not one of its maps as last read, or its file was not opened.
    pub fn file_of(&self, pid: u32, m: &Mapping) -> Option<((u64, u64), PathBuf)> {
        let p = self.procs.get(&pid)?;
        let i = self.find_index(pid, m.start)?;
        if p.maps.get(i) != Some(m) {
            return None;
        }
        match self.objects.get(*p.objects.get(i)? as usize) {
            Some(Some(Object {
                key: ObjectKey::File { dev, ino },
                file: Some(file),
                ..
            })) => Some(((*dev, *ino), fd_path(file))),
            _ => None,
        }
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

    /// Normalizes return addresses of process `pid`, taken at code
    /// generation `gen` (None: not known, named from the maps as read).
    /// Re-reads the maps once if an address is not covered (a library
    /// loaded after the last read). An address where other code was mapped
    /// since the stack was taken stays unnamed (counted).
    pub fn normalize(
        &mut self,
        pid: u32,
        return_addrs: &[u64],
        gen: Option<u32>,
    ) -> Vec<NormFrame> {
        let uncovered = return_addrs
            .iter()
            .any(|&a| self.find(pid, a.saturating_sub(1)).is_none());
        if uncovered {
            self.refresh(pid);
        }
        if let (Some(gen), Some(p)) = (gen, self.procs.get(&pid)) {
            self.code_stats.beyond_history += u64::from(!p.code.reaches(gen));
        }
        let mut replaced = false;
        let frames = return_addrs
            .iter()
            .map(|&ret| {
                let addr = ret.saturating_sub(1);
                if self.sure(pid, addr, gen) {
                    self.normalize_one(pid, addr)
                } else {
                    replaced = true;
                    NormFrame {
                        module: None,
                        offset: addr,
                    }
                }
            })
            .collect();
        self.code_stats.replaced += u64::from(replaced);
        frames
    }

    fn normalize_one(&mut self, pid: u32, addr: u64) -> NormFrame {
        let found = self.find_index(pid, addr).and_then(|i| {
            let p = self.procs.get(&pid)?;
            Some((p.maps.get(i)?, *p.objects.get(i)?))
        });
        let Some((m, object)) = found else {
            return self.normalize_jit(pid, addr);
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

    /// An address in no mapped file: JIT code named by the process's perf
    /// map or jitdump becomes (its name, offset in it); anything else stays
    /// a raw address.
    fn normalize_jit(&mut self, pid: u32, addr: u64) -> NormFrame {
        let unnamed = NormFrame {
            module: None,
            offset: addr,
        };
        let Some(p) = self.procs.get_mut(&pid) else {
            return unnamed;
        };
        let Some((start, name)) = p
            .jit_symbols
            .lookup(pid, addr, &p.maps, &mut self.jit_stats)
        else {
            return unnamed;
        };
        match self.jit_names.intern(name) {
            Some(module) => NormFrame {
                module: Some(module),
                offset: addr - start,
            },
            None => unnamed,
        }
    }

    /// `frames` of `pid` with the addresses in no file named from its JIT's
    /// files if they have a name now; None when none has.
    pub fn name_jit(&mut self, pid: u32, frames: &[NormFrame]) -> Option<Vec<NormFrame>> {
        let mut out = frames.to_vec();
        let mut named = false;
        for f in out.iter_mut().filter(|f| f.module.is_none()) {
            let n = self.normalize_jit(pid, f.offset);
            named |= n.module.is_some();
            *f = n;
        }
        named.then_some(out)
    }

    /// Reads what `pid`'s JIT files gained, now (no rate limit): at its
    /// exit, when the JIT has flushed them.
    pub fn read_jit_now(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.jit_symbols.read(pid, &p.maps, &mut self.jit_stats);
        }
    }

    /// The function name of a JIT frame's module id (None: an object).
    pub fn jit_name(&self, module: u32) -> Option<&str> {
        self.jit_names.get(module)
    }

    /// The JIT name files read over the trace (summed over processes) and
    /// the frames left unnamed at the interning cap.
    pub fn jit_stats(&self) -> (JitStats, u64) {
        (self.jit_stats, self.jit_names.refused)
    }

    /// What the JIT names of live processes hold: (processes with entries,
    /// entries), and frames left unnamed at the interning cap.
    pub fn jit_held(&self) -> (usize, usize, u64) {
        let with = self.procs.values().filter(|p| p.jit_symbols.entries() > 0);
        let (n, entries) = with.fold((0, 0), |(n, e), p| (n + 1, e + p.jit_symbols.entries()));
        (n, entries, self.jit_names.refused)
    }

    pub fn path(&self, module: u32) -> &str {
        if self.jit_names.get(module).is_some() {
            return JIT_MODULE_PATH;
        }
        match self.objects.get(module as usize) {
            Some(Some(o)) => o.path.as_str(),
            _ => "[unknown]",
        }
    }

    /// The build id and debug file of `module`, read on first use (None
    /// when the object was not opened).
    pub(super) fn debug_info(&self, module: u32) -> Option<&DebugInfo> {
        let Some(Some(o)) = self.objects.get(module as usize) else {
            return None;
        };
        let file = o.file.as_ref()?;
        Some(
            o.debug
                .get_or_init(|| DebugInfo::read(file, o.root.as_deref(), &o.path_in_root)),
        )
    }

    /// How many objects whose debug information was read have a refused
    /// debug link, and one as "path: link" (escaped).
    pub fn refused_debug_links(&self) -> (u64, Option<String>) {
        let mut refused = self.objects.iter().flatten().filter_map(|o| {
            let link = o.debug.get()?.refused_link.as_deref()?;
            Some((o.path.as_str(), link))
        });
        let Some((path, link)) = refused.next() else {
            return (0, None);
        };
        let example = format!("{}: {link}", crate::escape::text(path));
        (1 + refused.count() as u64, Some(example))
    }

    pub(super) fn open_path(&self, module: u32) -> Option<PathBuf> {
        let Some(Some(o)) = self.objects.get(module as usize) else {
            return None;
        };
        Some(fd_path(o.file.as_ref()?))
    }
}

#[cfg(test)]
mod tests;

mod code_history;
use code_history::CodeHistory;
pub use code_history::{BpfCodeGens, CodeGens};
use tracer_common::CodeMaps;
