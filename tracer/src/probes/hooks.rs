//! The objects hooked so far in a trace, and what each process uses.
//! Processes appear during a trace (--binary, system-wide, exec): each one's
//! allocator objects are found (allocators.rs) and any not yet hooked are
//! attached then.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Arc,
};

use crate::{
    error::TraceError,
    probes::loader::{self, AttachOptions, Loaded},
    probes::plan::HookFact,
    tracee::allocators::{Choice, Hooked},
    tracee::elf::{FileId, ObjectCache},
    tracee::search::Program,
};

pub struct Hooks {
    cache: ObjectCache,
    choice: Choice,
    opts: AttachOptions,
    /// Files attached (for every process, or for the one traced pid),
    /// each described ("glibc (/usr/lib/...)").
    attached: HashMap<FileId, String>,
    /// What became of each entry point of each attached file.
    lines: Vec<HookFact>,
    /// Objects hooked, described ("jemalloc (/usr/lib/...)"), in order.
    objects: Vec<String>,
    /// The allocator objects each inspected process uses.
    per_process: BTreeMap<u32, Arc<[Hooked]>>,
    /// The distinct lists in `per_process`, by the files they name: the
    /// processes of one program share one (a host that starts thousands
    /// of processes keeps a pointer per pid, not a copy of every list).
    lists: HashMap<Vec<(FileId, PathBuf)>, Arc<[Hooked]>>,
    /// Processes whose objects could not be attached: (pid, why).
    failures: Vec<(u32, String)>,
    /// Say on stderr when an object is hooked (once the trace runs).
    announce: bool,
    /// --verbose: also say what each process met during the trace uses.
    verbose: bool,
}

impl Hooks {
    /// `verbose`: say what each process met during the trace uses.
    pub fn new(choice: Choice, opts: AttachOptions, verbose: bool) -> Hooks {
        Hooks {
            cache: ObjectCache::default(),
            choice,
            opts,
            attached: HashMap::new(),
            lines: Vec::new(),
            objects: Vec::new(),
            per_process: BTreeMap::new(),
            lists: HashMap::new(),
            failures: Vec::new(),
            announce: false,
            verbose,
        }
    }

    /// From now on (the trace runs), each object hooked is said on stderr.
    pub fn announce_from_now(&mut self) {
        self.announce = true;
    }

    /// What became of each entry point of each attached file.
    pub fn lines(&self) -> &[HookFact] {
        &self.lines
    }

    /// The objects hooked, described, in order.
    pub fn objects(&self) -> &[String] {
        &self.objects
    }

    /// Processes whose objects could not be attached: (pid, why).
    pub fn failures(&self) -> &[(u32, String)] {
        &self.failures
    }

    /// `pid` could not be traced, for a reason found outside (a full filter).
    pub fn add_failure(&mut self, pid: u32, why: String) {
        self.failures.push((pid, why));
    }

    /// Whether `pid`'s allocators were inspected.
    pub fn knows(&self, pid: u32) -> bool {
        self.per_process.contains_key(&pid)
    }

    /// Every allocator object of every process inspected (with repeats).
    pub fn hooked_objects(&self) -> impl Iterator<Item = &Hooked> {
        self.per_process.values().flat_map(|h| h.iter())
    }

    /// `pid` is not a process of the trace (the tracer itself).
    pub fn forget(&mut self, pid: u32) {
        self.per_process.remove(&pid);
    }

    /// The rule for processes that vanish while they are read: a process
    /// gone while its maps were read looks like one that loads no
    /// allocator, which is no failure to report. Applied as a hook fails,
    /// and again here, once a batch of processes was hooked (`only`: for
    /// that one), for those gone since.
    pub fn drop_vanished(&mut self, only: Option<u32>) {
        self.failures
            .retain(|&(pid, _)| only.is_some_and(|p| p != pid) || !vanished(pid));
    }

    /// Finds `program`'s allocator objects and attaches those not attached
    /// yet, for `attach_pid` only or (None) for every process. `pid` is the
    /// process the program is (None: not started yet).
    pub fn hook(
        &mut self,
        loaded: &mut Loaded,
        program: &Program,
        pid: Option<u32>,
        attach_pid: Option<u32>,
    ) -> anyhow::Result<()> {
        let objects = program.allocators(&mut self.cache, &self.choice)?;
        for object in &objects {
            if self.attached.contains_key(&object.id) {
                continue;
            }
            let lines = loader::attach(loaded, object, attach_pid, &self.opts)?;
            self.attached.insert(object.id, object.describe());
            if self.announce {
                let whose = pid.map(|p| format!(" for pid {p}")).unwrap_or_default();
                let object = crate::escape::text(&object.describe()).into_owned();
                crate::console::say(format_args!("hooked {object}{whose}"));
            }
            self.objects.push(object.describe());
            self.lines.extend(lines);
        }
        if let Some(pid) = pid {
            if self.announce && self.verbose {
                let uses: Vec<String> = objects.iter().map(Hooked::describe).collect();
                let uses = crate::escape::text(&uses.join(", ")).into_owned();
                crate::console::say(format_args!("pid {pid} uses {uses}"));
            }
            let key: Vec<(FileId, PathBuf)> =
                objects.iter().map(|o| (o.id, o.path.clone())).collect();
            let shared = self
                .lists
                .entry(key)
                .or_insert_with(|| objects.into())
                .clone();
            self.per_process.insert(pid, shared);
        }
        Ok(())
    }

    /// `hook`, for a process met during the trace: a failure is kept for
    /// the report instead of ending the trace.
    pub fn hook_running(
        &mut self,
        loaded: &mut Loaded,
        pid: u32,
        program: Result<Program, TraceError>,
        attach_pid: Option<u32>,
    ) {
        let mut result = program
            .map_err(anyhow::Error::from)
            .and_then(|p| self.hook(loaded, &p, Some(pid), attach_pid));
        if result.is_err() && !crate::tracee::liveness::process_exited(pid) {
            // Met while its loader was still mapping its libraries (a new
            // process under --binary): what the loader will load counts.
            result = Program::just_executed(pid)
                .map_err(anyhow::Error::from)
                .and_then(|p| self.hook(loaded, &p, Some(pid), attach_pid));
        }
        if let Err(e) = result {
            if !vanished(pid) {
                self.failures.push((pid, format!("{e:#}")));
            }
        }
    }

    /// Probes for one process (`--pid`), after its exec: the objects
    /// attached that its new image does not use are detached, and said
    /// on stderr. Nothing is when its new image could not be read (its
    /// old list stands).
    pub fn detach_unused(&mut self, loaded: &mut Loaded, pid: u32) {
        let Some(uses) = self.per_process.get(&pid) else {
            return;
        };
        let unused: Vec<FileId> = self
            .attached
            .keys()
            .filter(|id| !uses.iter().any(|h| h.id == **id))
            .copied()
            .collect();
        for id in unused {
            if let Some(object) = self.detach(loaded, id) {
                crate::console::say(format_args!(
                    "unhooked {} for pid {pid}: its new image does not use it",
                    crate::escape::text(&object)
                ));
            }
        }
    }

    /// Detaches every object: the task its probes were bound to is gone
    /// (an exec from another thread). `hook` attaches them again.
    pub fn detach_all(&mut self, loaded: &mut Loaded) {
        let all: Vec<FileId> = self.attached.keys().copied().collect();
        for id in all {
            self.detach(loaded, id);
        }
    }

    /// Detaches `id`'s probes and returns its description. One that
    /// cannot be stays attached (and known as such), said on stderr.
    fn detach(&mut self, loaded: &mut Loaded, id: FileId) -> Option<String> {
        match loaded.detach_object(id) {
            Ok(()) => self.attached.remove(&id),
            Err(e) => {
                crate::console::warn(format_args!("{}", crate::escape::text(&format!("{e:#}"))));
                None
            }
        }
    }

    /// The allocator objects `pid` uses; for a running process the trace
    /// saw but did not inspect (a child forked without exec), read now (not
    /// for one that exited: its pid may be another process's now).
    pub fn process_objects(&mut self, pid: u32, running: bool) -> Vec<Hooked> {
        if let Some(known) = self.per_process.get(&pid) {
            return known.to_vec();
        }
        if !running {
            return Vec::new();
        }
        Program::running(pid)
            .ok()
            .and_then(|p| p.allocators(&mut self.cache, &self.choice).ok())
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.attached.is_empty()
    }
}

/// See `Hooks::drop_vanished`.
fn vanished(pid: u32) -> bool {
    crate::tracee::liveness::process_exited(pid)
}
