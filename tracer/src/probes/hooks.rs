//! The objects hooked so far in a trace, and what each process uses.
//! Processes appear during a trace (--binary, system-wide, exec): each one's
//! allocator objects are found (allocators.rs) and any not yet hooked are
//! attached then.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
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
    /// Files attached (for every process, or for the one traced pid).
    attached: HashSet<FileId>,
    /// What became of each entry point of each attached file.
    pub lines: Vec<HookFact>,
    /// Objects hooked, described ("jemalloc (/usr/lib/...)"), in order.
    pub objects: Vec<String>,
    /// The allocator objects each inspected process uses.
    pub per_process: BTreeMap<u32, Arc<[Hooked]>>,
    /// The distinct lists in `per_process`, by the files they name: the
    /// processes of one program share one (a host that starts thousands
    /// of processes keeps a pointer per pid, not a copy of every list).
    lists: HashMap<Vec<(FileId, PathBuf)>, Arc<[Hooked]>>,
    /// Processes whose objects could not be attached: (pid, why).
    pub failures: Vec<(u32, String)>,
    /// Say on stderr when an object is hooked (once the trace runs).
    pub announce: bool,
    /// --verbose: also say what each process met during the trace uses.
    pub verbose: bool,
}

impl Hooks {
    pub fn new(choice: Choice, opts: AttachOptions) -> Hooks {
        Hooks {
            cache: ObjectCache::default(),
            choice,
            opts,
            attached: HashSet::new(),
            lines: Vec::new(),
            objects: Vec::new(),
            per_process: BTreeMap::new(),
            lists: HashMap::new(),
            failures: Vec::new(),
            announce: false,
            verbose: false,
        }
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
            if self.attached.contains(&object.id) {
                continue;
            }
            let lines = loader::attach(loaded, object, attach_pid, &self.opts)?;
            self.attached.insert(object.id);
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
            // A process gone while its maps were read looks like one that
            // loads no allocator: that is no failure to report.
            if !crate::tracee::liveness::process_exited(pid) {
                self.failures.push((pid, format!("{e:#}")));
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
