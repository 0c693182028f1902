//! Loading the BPF object and attaching it from a declarative table.

use std::{collections::HashMap, num::NonZeroU32, path::Path};

use anyhow::{bail, Context as _};
use aya::{
    maps::{Array, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{uprobe::UProbeScope, Program, RawTracePoint, UProbe},
    Ebpf, EbpfLoader, VerifierLogLevel,
};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd, RawFd};
use tracer_common::{
    names::{global, map, program},
    LiveKey, LiveValue, Role, CONTROL_SESSION, CONTROL_STOPPED,
};

use super::object_maps::{self, map_fds, raise_memlock_limit, seed_countdowns, take};
use super::{kernel_features::KernelFeatures, object_patch, verifier::Rejected};
use crate::{
    console, escape,
    probes::plan::{self, HookFact, PlannedProbe},
    probes::roles,
    probes::uprobe_session,
    probes::{Limits, ProbePlacement, UnwindMode},
    tracee::{allocators::Hooked, elf::FileId},
};

/// The BPF object built by build.rs from tracer-ebpf.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace"));

/// The BPF object as built (for tests of what reads it).
#[cfg(test)]
pub(crate) fn bpf_object() -> &'static [u8] {
    BPF_OBJECT
}

const RETURN_PROGRAM: &str = program::ALLOC_RETURN;
/// The raw tracepoint programs and their tracepoints: exec, fork, exit of
/// traced processes; signal_deliver marks a thread's allocator call
/// interrupted, so a handler's calls are recorded (tracer-ebpf inflight.rs);
/// mark_victim reports a traced process the OOM killer chose.
const TRACEPOINTS: [(&str, &str); 5] = [
    (program::PROCESS_EXEC, "sched_process_exec"),
    (program::PROCESS_FORK, "sched_process_fork"),
    (program::PROCESS_EXIT, "sched_process_exit"),
    (program::SIGNAL_DELIVER, "signal_deliver"),
    (program::OOM_MARK_VICTIM, "mark_victim"),
];

/// The fexit program that bumps a process's code generation when it maps
/// a file executable (tracer-ebpf code_gen.rs), and its kernel function;
/// where the kernel refuses fexit programs, the raw tracepoint program
/// that does the same at every system call's exit.
const CODE_GEN_PROGRAM: &str = program::MAPS_CHANGE;
const CODE_GEN_FUNCTION: &str = "vm_mmap_pgoff";
const CODE_GEN_SYSCALL_PROGRAM: &str = program::MAPS_CHANGE_SYSCALL;
const CODE_GEN_TRACEPOINT: &str = "sys_exit";

/// Entries of the TRACED map (tracer-ebpf sets the same size).
pub const MAX_FILTERED_PIDS: u32 = 8192;

/// The loaded object with its probes and control maps.
pub struct Loaded {
    /// Dropping this detaches every probe; None once they are being
    /// detached (`detach_in_background`).
    ebpf: Option<Ebpf>,
    pub counters: PerCpuArray<MapData, u64>,
    control: Array<MapData, u32>,
    /// CONTROL bits set so far (CONTROL_SESSION once sessions are attached).
    control_bits: u32,
    /// The tail-call table of the uprobe session dispatcher.
    progs_fd: RawFd,
    /// Every map's fd by name, for the session copies of the programs.
    map_fds: HashMap<String, OwnedFd>,
    /// The dispatcher and the session copies it tail-calls.
    session_progs: Vec<OwnedFd>,
    /// Each attached object's links (uprobe session, uprobe_multi and
    /// perf-event ones), for detaching one object's probes.
    links: super::links::Links,
    /// free's programs (the plain one and glibc's) loaded for
    /// uprobe_multi links (with the session copies), by name, when the
    /// kernel took them.
    free_multi: HashMap<String, OwnedFd>,
    /// Why uprobe sessions are not used, when they were wanted.
    pub session_error: Option<String>,
    /// How code generations are kept: `Ok(true)` by the fexit program,
    /// `Ok(false)` by the sys_exit tracepoint (why fexit was refused
    /// beside it), `Err` not at all (frames named from the maps as read).
    pub code_gen: Result<(bool, Option<String>), String>,
    /// Tgids traced (FILTER_PIDS) or excluded (FILTER_ALL, FILTER_CGROUP).
    traced: aya::maps::HashMap<MapData, u32, u8>,
    /// FILTER_CGROUP: the traced cgroup's id (0: none).
    cgroup: Array<MapData, u64>,
    /// The unwind mode the programs were loaded for (a rejected one falls
    /// back to the next).
    unwind: UnwindMode,
    features: KernelFeatures,
    /// The object as loaded (its kfunc calls resolved for this kernel),
    /// from which the session copies are made.
    object: std::sync::Arc<[u8]>,
    /// Why an earlier mode was not used.
    fallback: Option<String>,
    /// Each program's verified instructions, largest first.
    verified: Vec<(String, u32)>,
}

/// The maps the collector reads events and stacks from.
pub struct EventMaps {
    pub events: RingBuf<MapData>,
    pub stacks: StackTraceMap<MapData>,
    /// Recorded live blocks; user space deletes those of exited processes.
    pub live: aya::maps::HashMap<MapData, LiveKey, LiveValue>,
    /// Counts LIVE's entries (--verbose).
    pub live_count: super::map_count::MapCounter,
    /// `--unwind tables`: the rows and mappings the kernel walks with.
    pub unwind: Option<crate::stacks::kernel_tables::BpfUnwindMaps>,
    /// Each process's code generation (tracer-ebpf code_gen.rs).
    /// Taken by the session for `Modules`.
    pub code_gens: Option<crate::stacks::modules::BpfCodeGens>,
}

impl Loaded {
    /// Ends the trace at this instant: entry and free probes turn into
    /// no-ops (calls already inside the allocator still complete), so the
    /// heap is not changed by what happens while the probes are detached.
    /// Adds `pid` to the TRACED map (see tracer_common::FILTER_*).
    pub fn add_filtered_pid(&mut self, pid: u32) -> anyhow::Result<()> {
        self.traced
            .insert(pid, 1, 0)
            .with_context(|| format!("adding pid {pid} to the process filter"))
    }

    /// --cgroup: the cgroup whose subtree is traced from now on, by its
    /// id (0: none, as while the path given names no cgroup).
    pub fn set_traced_cgroup(&mut self, id: u64) -> anyhow::Result<()> {
        self.cgroup
            .set(0, id, 0)
            .context("setting the traced cgroup")
    }

    /// Detaches every probe of the attached file `object` (none: nothing).
    pub fn detach_object(&mut self, object: FileId) -> anyhow::Result<()> {
        let ebpf = self
            .ebpf
            .as_mut()
            .context("the probes are being detached")?;
        self.links.detach(ebpf, object)
    }

    pub fn remove_filtered_pid(&mut self, pid: u32) -> anyhow::Result<()> {
        self.traced
            .remove(&pid)
            .with_context(|| format!("removing pid {pid} from the process filter"))
    }

    /// Instructions the verifier processed for each program, largest
    /// first (empty before 5.16, which does not report them).
    pub fn verified_instructions(&self) -> &[(String, u32)] {
        &self.verified
    }

    /// The unwind mode the programs run in.
    pub fn unwind(&self) -> UnwindMode {
        self.unwind
    }

    /// Why the mode asked for was not used, when it was not.
    pub fn fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The mode in words, for the line said at the start and the report.
    pub fn mode_line(&self, sessions: bool) -> String {
        let probes = if sessions && self.features.uprobe_session {
            "uprobe sessions where they attach"
        } else {
            "uprobes + uretprobes"
        };
        format!(
            "kernel {}: mode: unwind {}, {probes}, {}",
            self.features.release,
            self.unwind.name(),
            self.features.inflight_words()
        )
    }

    /// Whether any allocating function runs as a uprobe session.
    pub fn sessions_attached(&self) -> bool {
        self.control_bits & CONTROL_SESSION != 0
    }

    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.set_control(CONTROL_STOPPED)
            .context("telling the BPF programs to stop")
    }

    fn set_control(&mut self, bit: u32) -> anyhow::Result<()> {
        self.control_bits |= bit;
        self.control.set(0, self.control_bits, 0)?;
        Ok(())
    }
}

/// How `attach` places and attaches probes.
#[derive(Clone, Copy, Debug)]
pub struct AttachOptions {
    pub placement: ProbePlacement,
    /// No-op programs instead of the real ones (benchmark floors).
    pub noop: bool,
    /// Try uprobe session programs for the allocating functions.
    pub sessions: bool,
}

/// Unwind modes to try, best first, from the one asked for: a program
/// the verifier rejects in one mode makes the next one be tried.
fn modes_from(first: UnwindMode) -> &'static [UnwindMode] {
    match first {
        UnwindMode::Tables => &[UnwindMode::Tables, UnwindMode::Dwarf, UnwindMode::Fp],
        UnwindMode::Dwarf => &[UnwindMode::Dwarf, UnwindMode::Fp],
        UnwindMode::Fp => &[UnwindMode::Fp],
    }
}

/// Loads the BPF object in the best mode this kernel's verifier accepts,
/// starting from `limits.unwind`; says so when it falls back.
pub fn load(
    limits: &Limits,
    features: &KernelFeatures,
    verbose: bool,
) -> anyhow::Result<(Loaded, EventMaps)> {
    raise_memlock_limit();
    let object: std::sync::Arc<[u8]> = object_patch::for_kernel(BPF_OBJECT, features)?.into();
    let ((mut loaded, maps), rejected) = first_that_loads(
        modes_from(limits.unwind),
        &features.release,
        |mode| load_mode(limits, mode, features, &object, verbose),
        |line| console::say(format_args!("{}", escape::text(&line))),
    )?;
    loaded.fallback = rejected.map(|r| r.to_string());
    Ok((loaded, maps))
}

/// The first of `modes` that `load` loads, with the rejection that made
/// it fall back, if any; each fallback is said. An error other than a
/// verifier's rejection ends the search.
fn first_that_loads<T>(
    modes: &[UnwindMode],
    kernel: &str,
    mut load: impl FnMut(UnwindMode) -> anyhow::Result<T>,
    mut say: impl FnMut(String),
) -> anyhow::Result<(T, Option<Rejected>)> {
    let mut rejected: Option<Rejected> = None;
    for (i, &mode) in modes.iter().enumerate() {
        let err = match load(mode) {
            Ok(loaded) => return Ok((loaded, rejected)),
            Err(err) => err,
        };
        let r = err.downcast::<Rejected>()?;
        if let Some(next) = modes.get(i + 1) {
            say(format!("{r}; falling back to --unwind {}", next.name()));
        }
        rejected = Some(r);
    }
    let r = rejected.context("no unwind mode to try")?;
    bail!(
        "no mode of memtrace-bpf loads on kernel {kernel}: {r}. Every kernel from 5.10 on is \
         expected to load; try --unwind fp (the smallest programs) and report this with the \
         log file"
    )
}

/// Loads the object for one unwind mode; a program the verifier refuses
/// is returned as a `Rejected` error.
fn load_mode(
    limits: &Limits,
    unwind: UnwindMode,
    features: &KernelFeatures,
    object: &std::sync::Arc<[u8]>,
    verbose: bool,
) -> anyhow::Result<(Loaded, EventMaps)> {
    let limits = &Limits { unwind, ..*limits };
    let (mode, stack_entries) = match unwind {
        UnwindMode::Fp => (tracer_common::UNWIND_FP, limits.stack_storage_size),
        // The kernel stack map is not used: keep it minimal.
        UnwindMode::Dwarf => (tracer_common::UNWIND_DWARF, 1),
        UnwindMode::Tables => (tracer_common::UNWIND_TABLES, 1),
    };
    let (unwind_rows, unwind_mappings) = object_maps::unwind_sizes(limits);
    let table = crate::model::sampling::exp_table();
    let forks = fork_tunables(limits)?;
    let inflight_by_tid = u32::from(!features.task_storage);
    let attach_cookies = u32::from(features.attach_cookie);
    let atomic_slots = u32::from(features.atomics);
    // Statistics and the error's own lines only: a verbose log of a large
    // program runs to megabytes, and aya retries a load with a larger
    // buffer each time the log does not fit, verifying it again.
    let log_level = if verbose {
        VerifierLogLevel::DEBUG | VerifierLogLevel::STATS
    } else {
        VerifierLogLevel::STATS
    };
    let mut ebpf = EbpfLoader::new()
        // INFLIGHT is task storage, which aya 0.14 creates but has no
        // user-space type for; user space never opens it.
        .allow_unsupported_maps()
        .verifier_log_level(log_level)
        .map_max_entries(map::LIVE, limits.max_live)
        .map_max_entries(map::STACKS, stack_entries)
        .map_max_entries(map::TRACED, MAX_FILTERED_PIDS)
        .map_max_entries(map::EVENTS, limits.ringbuf_bytes)
        .map_max_entries(map::UNWIND_ROWS, unwind_rows)
        .map_max_entries(map::UNWIND_MAPPINGS, unwind_mappings)
        .map_max_entries(map::INFLIGHT, object_patch::inflight_entries(features))
        // tracer-ebpf free.rs: exact mode's filter of frees of blocks no
        // process reported (8 MiB); a page when sampling, which uses LIVE.
        .map_max_entries(
            map::SEEN,
            if limits.sampling.is_exact() {
                tracer_common::SEEN_PAGES
            } else {
                1
            },
        )
        .override_global(global::UNWIND_MODE, &mode, true)
        .override_global(global::STACK_BYTES, &limits.stack_bytes, true)
        .override_global(global::SAMPLE_RATE, &limits.sampling.rate(), true)
        .override_global(global::FILTER, &limits.filter, true)
        .override_global(global::COMM, &limits.comm, true)
        .override_global(global::CGROUP_LEVEL, &limits.cgroup.level, true)
        .override_global(global::EXP_TABLE, table.as_slice(), true)
        .override_global(global::FOLLOW_FORKS, &forks.follow, true)
        .override_global(global::TASK_TGID_OFFSET, &forks.tgid_offset, true)
        .override_global(global::EXIT_GROUP_DEAD, &forks.exit_group_dead, true)
        .override_global(global::INFLIGHT_BY_TID, &inflight_by_tid, true)
        .override_global(global::ATTACH_COOKIES, &attach_cookies, true)
        .override_global(global::ATOMIC_SLOTS, &atomic_slots, true)
        .load(object)
        .context("loading the BPF object into the kernel")?;
    let map_fds = map_fds(&ebpf)?;
    let events = RingBuf::try_from(take(&mut ebpf, map::EVENTS)?)?;
    let stacks = StackTraceMap::try_from(take(&mut ebpf, map::STACKS)?)?;
    let live = take(&mut ebpf, map::LIVE)?;
    let live_count = match &live {
        aya::maps::Map::HashMap(data) => super::map_count::MapCounter::new(
            data.fd().as_fd().try_clone_to_owned()?,
            std::mem::size_of::<LiveKey>(),
            std::mem::size_of::<LiveValue>(),
        ),
        _ => anyhow::bail!("LIVE is not a hash map"),
    };
    let live = aya::maps::HashMap::try_from(live)?;
    let counters = PerCpuArray::try_from(take(&mut ebpf, map::COUNTERS)?)?;
    let control = Array::try_from(take(&mut ebpf, map::CONTROL)?)?;
    let traced = aya::maps::HashMap::try_from(take(&mut ebpf, map::TRACED)?)?;
    let cgroup = object_maps::traced_cgroup(&mut ebpf, limits.cgroup.id)?;
    let unwind_maps = object_maps::take_unwind(&mut ebpf, limits)?;
    let code_gens = crate::stacks::modules::BpfCodeGens::new(
        take(&mut ebpf, map::MAPS_GEN)?,
        take(&mut ebpf, map::MAPS_READ)?,
    )?;
    let progs_fd = map_fds
        .get(map::PROGS)
        .context("BPF object has no map PROGS")?
        .as_raw_fd();
    seed_countdowns(&mut ebpf, limits.sampling.rate(), &table)?;
    let verified = load_programs(&mut ebpf, &features.release, unwind.name())?;
    for (program, tracepoint) in TRACEPOINTS {
        attach_tracepoint(&mut ebpf, program, tracepoint)?;
    }
    let code_gen = attach_code_gen(&mut ebpf);
    Ok((
        Loaded {
            ebpf: Some(ebpf),
            counters,
            control,
            control_bits: 0,
            progs_fd,
            map_fds,
            session_progs: Vec::new(),
            links: super::links::Links::default(),
            free_multi: HashMap::new(),
            session_error: None,
            code_gen,
            traced,
            cgroup,
            unwind,
            features: features.clone(),
            object: std::sync::Arc::clone(object),
            fallback: None,
            verified,
        },
        EventMaps {
            events,
            stacks,
            live,
            live_count,
            unwind: unwind_maps,
            code_gens: Some(code_gens),
        },
    ))
}

/// Verifies every program of the object; returns each one's verified
/// instructions (`bpf_prog_info.verified_insns`, 5.16+), largest first.
fn load_programs(
    ebpf: &mut Ebpf,
    kernel: &str,
    mode: &'static str,
) -> anyhow::Result<Vec<(String, u32)>> {
    let mut verified = Vec::new();
    for (name, prog) in ebpf.programs_mut() {
        let loaded = match &mut *prog {
            // Loaded when needed, by attach_code_gen.
            Program::FExit(_) => continue,
            Program::RawTracePoint(_) if name == CODE_GEN_SYSCALL_PROGRAM => continue,
            Program::RawTracePoint(p) => p.load(),
            p => <&mut UProbe>::try_from(p)?.load(),
        };
        if let Err(err) = loaded {
            return Err(match Rejected::from_error(&err, name, kernel, mode) {
                Some(r) => anyhow::Error::new(r),
                None => anyhow::Error::new(err).context(format!("loading BPF program {name}")),
            });
        }
        let insns = prog
            .info()
            .ok()
            .and_then(|i| i.verified_instruction_count());
        if let Some(n) = insns {
            verified.push((name.to_string(), n));
        }
    }
    verified.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Ok(verified)
}

/// The fork and exit programs' load-time globals.
struct ForkTunables {
    follow: u32,
    tgid_offset: u32,
    exit_group_dead: u32,
}

/// Children are counted (or followed) only where the kernel's BTF says
/// where a task's tgid is; without it --follow-forks cannot work, and the
/// count of children not traced is left out (tgid_offset 0).
fn fork_tunables(limits: &Limits) -> anyhow::Result<ForkTunables> {
    let follow = if limits.follow_forks {
        tracer_common::FORKS_FOLLOW
    } else {
        tracer_common::FORKS_COUNT
    };
    let facts = match crate::probes::kernel_btf::task_facts() {
        Ok(facts) => facts,
        Err(e) if limits.follow_forks => {
            return Err(e.context(
                "--follow-forks needs the kernel's BTF (CONFIG_DEBUG_INFO_BTF) to find a new \
                 task's process id: run without --follow-forks on this kernel",
            ))
        }
        Err(_) => {
            return Ok(ForkTunables {
                follow,
                tgid_offset: 0,
                exit_group_dead: 0,
            })
        }
    };
    Ok(ForkTunables {
        follow,
        tgid_offset: facts.tgid_offset,
        exit_group_dead: u32::from(facts.exit_has_group_dead),
    })
}

/// Loads and attaches a code-generation program: the fexit one, else the
/// sys_exit one. An error leaves the trace without generations (said
/// with --verbose), never fails it.
fn attach_code_gen(ebpf: &mut Ebpf) -> Result<(bool, Option<String>), String> {
    let fexit = match attach_code_gen_fexit(ebpf) {
        Ok(()) => return Ok((true, None)),
        Err(e) => format!("{e:#}"),
    };
    match load_and_attach_tracepoint(ebpf, CODE_GEN_SYSCALL_PROGRAM, CODE_GEN_TRACEPOINT) {
        Ok(()) => Ok((false, Some(fexit))),
        Err(e) => Err(format!("{fexit}; {e:#}")),
    }
}

fn load_and_attach_tracepoint(
    ebpf: &mut Ebpf,
    program: &str,
    tracepoint: &str,
) -> anyhow::Result<()> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?;
    prog.load()
        .with_context(|| format!("loading BPF program {program}"))?;
    attach_tracepoint(ebpf, program, tracepoint)
}

fn attach_code_gen_fexit(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let prog: &mut aya::programs::FExit = ebpf
        .program_mut(CODE_GEN_PROGRAM)
        .with_context(|| format!("BPF object has no program {CODE_GEN_PROGRAM}"))?
        .try_into()?;
    prog.load(CODE_GEN_FUNCTION, &btf)
        .with_context(|| format!("loading an fexit program of {CODE_GEN_FUNCTION}"))?;
    prog.attach()
        .with_context(|| format!("attaching an fexit program to {CODE_GEN_FUNCTION}"))?;
    Ok(())
}

fn attach_tracepoint(ebpf: &mut Ebpf, program: &str, tracepoint: &str) -> anyhow::Result<()> {
    let prog: &mut RawTracePoint = ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?;
    prog.attach(tracepoint)
        .with_context(|| format!("attaching to the {tracepoint} tracepoint"))?;
    Ok(())
}

/// Attaches the entry points of `object` for process `pid` (every process
/// when None) as `plan::plan` decides. Returns one fact per entry point for
/// the report.
///
/// Return probes are attached before any entry probe, so that every entry
/// that fires has its return hooked; `detach` removes them in the opposite
/// order. An entry without its return would leave a stale in-flight record.
pub fn attach(
    loaded: &mut Loaded,
    object: &Hooked,
    pid: Option<u32>,
    opts: &AttachOptions,
) -> anyhow::Result<Vec<HookFact>> {
    // The file parsed, whatever happens to its path while it is attached;
    // errors name the file as the process sees it.
    let pinned = super::pinned::Pinned::open(&object.host_path, object.id)?;
    let attached = attach_at(loaded, object, &pinned.path(), pid, opts);
    if attached.is_err() {
        // What was attached of it before the failure goes too.
        let _ = loaded.detach_object(object.id);
    }
    attached.with_context(|| format!("hooking {}", object.path.display()))
}

/// `attach`, with the object's file at `host_path`.
fn attach_at(
    loaded: &mut Loaded,
    object: &Hooked,
    host_path: &Path,
    pid: Option<u32>,
    opts: &AttachOptions,
) -> anyhow::Result<Vec<HookFact>> {
    let module = object.path.to_string_lossy();
    let pid = pid.and_then(NonZeroU32::new);
    let planned = plan::plan(object, opts.placement)?;
    let facts = |session: bool| planned.iter().map(|p| p.fact(&module, session)).collect();
    // Kernels before 6.13 have no uprobe sessions: not tried there.
    if opts.sessions && !opts.noop && loaded.features.uprobe_session {
        match attach_sessions(loaded, &planned, object, host_path, pid) {
            Ok(()) => return Ok(facts(true)),
            Err(e) => loaded.session_error = Some(format!("{e:#}")),
        }
    }
    let to_attach = || planned.iter().filter_map(|p| Some((p.role, p.placed()?)));
    for (role, placed) in to_attach() {
        if roles::of(role).returns {
            let ret = if opts.noop {
                program::NOOP_RETURN
            } else {
                RETURN_PROGRAM
            };
            attach_one(
                loaded,
                ret,
                placed.plain.0,
                (Some(object.id), host_path),
                pid,
            )?;
        }
    }
    for (role, placed) in to_attach() {
        let entry = match (opts.noop, role) {
            (true, _) => program::NOOP_ENTER,
            (false, Role::Free) => roles::free_program(object.kind),
            (false, _) => roles::of(role).program,
        };
        attach_one(
            loaded,
            entry,
            placed.plain.0,
            (Some(object.id), host_path),
            pid,
        )?;
    }
    Ok(facts(false))
}

/// Attaches the allocating functions as one uprobe session link (see
/// uprobe_session.rs) and free as a plain uprobe, on `object`'s file at
/// `path`.
fn attach_sessions(
    loaded: &mut Loaded,
    planned: &[PlannedProbe],
    hooked: &Hooked,
    path: &Path,
    pid: Option<NonZeroU32>,
) -> anyhow::Result<()> {
    let object = hooked.id;
    if loaded.session_progs.is_empty() {
        // The kernel lets a session program tail-call only programs of the
        // same attach type: load session copies of the real programs.
        let session_roles: Vec<Role> = Role::ALL.into_iter().filter(|r| *r != Role::Free).collect();
        let mut names: Vec<&str> = session_roles
            .iter()
            .map(|&r| roles::of(r).program)
            .collect();
        names.push(RETURN_PROGRAM);
        let mut copies =
            uprobe_session::load_copies(&loaded.object, &names, &loaded.map_fds, true)?;
        for (role, name) in session_roles.iter().zip(&names) {
            let fd = copies.remove(*name).context("session copy")?;
            uprobe_session::set_prog_slot(loaded.progs_fd, *role as u32, &fd)?;
            loaded.session_progs.push(fd);
        }
        let ret = copies.remove(RETURN_PROGRAM).context("session copy")?;
        uprobe_session::set_prog_slot(loaded.progs_fd, uprobe_session::RETURN_SLOT, &ret)?;
        loaded.session_progs.push(ret);
        // The dispatcher last: it is the one that is attached.
        let dispatcher = uprobe_session::load_dispatcher(loaded.progs_fd)?;
        loaded.session_progs.push(dispatcher);
        // free as a uprobe_multi link where the kernel takes one (it has
        // sessions, so it should): cheaper per call than a perf-event
        // uprobe (uprobe_session.rs). If not, a plain uprobe.
        let frees = [roles::of(Role::Free).program, roles::FREE_GLIBC_PROGRAM];
        loaded.free_multi =
            uprobe_session::load_copies(&loaded.object, &frees, &loaded.map_fds, false)
                .unwrap_or_default();
    }

    let placed = || planned.iter().filter_map(|p| Some((p.role, p.placed()?)));
    let (offsets, cookies): (Vec<u64>, Vec<u64>) = placed()
        .filter(|(role, _)| *role != Role::Free)
        .map(|(_, p)| (p.session.0, p.cookie))
        .unzip();
    // free first: a block recorded before free is hooked would have its
    // free missed, stay "live" and be replaced when its address is reused.
    let free = roles::free_program(hooked.kind);
    for (_, p) in placed().filter(|(role, _)| *role == Role::Free) {
        let multi = loaded.free_multi.get(free).and_then(|prog| {
            uprobe_session::attach_multi(prog, path, &[p.plain.0], pid.map_or(0, NonZeroU32::get))
                .ok()
        });
        match multi {
            Some(link) => loaded.links.add_fd(object, link),
            None => attach_one(loaded, free, p.plain.0, (Some(object), path), pid)?,
        }
    }
    let prog = loaded.session_progs.last().context("session program")?;
    let link = uprobe_session::attach(
        prog,
        path,
        &offsets,
        &cookies,
        pid.map_or(0, NonZeroU32::get),
    )?;
    loaded.links.add_fd(object, link);
    loaded.set_control(CONTROL_SESSION)
}

/// `--binary`: attaches `binary_entry` (tracer-ebpf) at the program's ELF
/// entry point, so that each process starting it is traced from there on.
pub fn attach_binary_entry(loaded: &mut Loaded, path: &Path) -> anyhow::Result<()> {
    use object::Object as _;
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF file", path.display()))?;
    let offset = crate::tracee::elf::vaddr_to_file_offset(&file, file.entry())
        .with_context(|| format!("{}: its entry point is in no segment", path.display()))?;
    // Not an object's: attached until the trace ends.
    attach_one(loaded, program::BINARY_ENTRY, offset, (None, path), None)
}

/// Attaches `program` at `offset` in the file at `path`, recording the
/// link as `object`'s, if given.
fn attach_one(
    loaded: &mut Loaded,
    program: &'static str,
    offset: u64,
    (object, path): (Option<FileId>, &Path),
    pid: Option<NonZeroU32>,
) -> anyhow::Result<()> {
    let scope = match pid {
        Some(pid) => UProbeScope::OneProcess(pid),
        None => UProbeScope::AllProcesses,
    };
    let ebpf = loaded
        .ebpf
        .as_mut()
        .context("the probes are being detached")?;
    let link = uprobe(ebpf, program)?
        .attach(offset, path, scope)
        .with_context(|| format!("attaching {program} at {}+{offset:#x}", path.display()))?;
    if let Some(object) = object {
        loaded.links.add_perf(object, program, link);
    }
    Ok(())
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &str) -> anyhow::Result<&'a mut UProbe> {
    Ok(ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?)
}

/// Probes being detached on a thread of their own (`detach_in_background`).
pub struct Detaching(std::thread::JoinHandle<anyhow::Result<()>>);

impl Loaded {
    /// Starts detaching every probe, entry probes before the return probe,
    /// on a thread of its own, and returns at once. Call after `stop` (the
    /// probes are no-ops then: what they still see changes nothing) and
    /// after the last attach. The maps stay: the report reads the counters
    /// and the collector its maps as before. The kernel waits for a grace
    /// period on each uprobe link it removes (0.05-0.25 s each here, idle,
    /// not CPU): spent while the report is built, not after it.
    pub fn detach_in_background(&mut self) -> Detaching {
        let links = self.links.take_fds();
        let progs = std::mem::take(&mut self.session_progs);
        let ebpf = self.ebpf.take();
        Detaching(std::thread::spawn(move || detach(links, progs, ebpf)))
    }
}

impl Detaching {
    /// Waits until every probe is detached.
    pub fn wait(self) -> anyhow::Result<()> {
        self.0
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the thread detaching the probes panicked")))
    }
}

/// Detaches every probe, entry probes before the return probe. The kernel
/// synchronizes on each uprobe it removes, so this takes a moment.
fn detach(
    session_links: Vec<OwnedFd>,
    session_progs: Vec<OwnedFd>,
    ebpf: Option<Ebpf>,
) -> anyhow::Result<()> {
    drop(session_links);
    drop(session_progs);
    let Some(mut ebpf) = ebpf else {
        return Ok(());
    };
    let mut programs: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    programs.retain(|n| {
        n != CODE_GEN_PROGRAM
            && n != CODE_GEN_SYSCALL_PROGRAM
            && TRACEPOINTS.iter().all(|(p, _)| p != n)
    });
    programs.sort_by_key(|n| n == RETURN_PROGRAM || n == program::NOOP_RETURN);
    for name in programs {
        uprobe(&mut ebpf, &name)?
            .unload()
            .with_context(|| format!("detaching {name}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejected(mode: &'static str) -> anyhow::Error {
        anyhow::Error::new(Rejected {
            program: "alloc_return".into(),
            kernel: "7.2.0".into(),
            mode,
            reason: "BPF program is too large".into(),
            log: None,
        })
    }

    #[test]
    fn a_rejected_mode_falls_back_to_the_next_and_says_so() {
        let mut said = Vec::new();
        let mut tried = Vec::new();
        let (mode, why) = first_that_loads(
            modes_from(UnwindMode::Tables),
            "7.2.0",
            |mode| {
                tried.push(mode);
                match mode {
                    UnwindMode::Tables => Err(rejected("tables")),
                    m => Ok(m),
                }
            },
            |line| said.push(line),
        )
        .expect("dwarf loads");
        assert_eq!(mode, UnwindMode::Dwarf);
        assert_eq!(tried, [UnwindMode::Tables, UnwindMode::Dwarf]);
        assert!(why.is_some_and(|r| r.mode == "tables"));
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("rejected BPF program alloc_return (--unwind tables)"));
        assert!(said[0].ends_with("falling back to --unwind dwarf"));
    }

    #[test]
    fn an_error_that_is_not_a_rejection_ends_the_search() {
        let mut tried = 0;
        let err = first_that_loads(
            modes_from(UnwindMode::Tables),
            "6.18",
            |_| -> anyhow::Result<()> {
                tried += 1;
                bail!("creating map LIVE: out of memory")
            },
            |_| {},
        )
        .expect_err("no fallback");
        assert_eq!(tried, 1);
        assert!(err.to_string().contains("out of memory"));
    }

    #[test]
    fn when_no_mode_loads_the_error_names_kernel_program_and_what_to_try() {
        let err = first_that_loads(
            modes_from(UnwindMode::Dwarf),
            "7.2.0",
            |mode| -> anyhow::Result<()> { Err(rejected(mode.name())) },
            |_| {},
        )
        .expect_err("nothing loads");
        let text = err.to_string();
        assert!(text.starts_with("no mode of memtrace-bpf loads on kernel 7.2.0"));
        assert!(text.contains("alloc_return (--unwind fp)"), "{text}");
        assert!(text.contains("try --unwind fp"), "{text}");
    }
}
