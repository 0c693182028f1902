//! Attaching a traced file's probes as the plan places them: plain
//! uprobes, or uprobe sessions where the kernel has them; and `--binary`'s
//! probe at a program's entry point.

use std::{num::NonZeroU32, path::Path};

use anyhow::Context as _;
use aya::{
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf,
};
use tracer_common::{names::program, Role, CONTROL_SESSION};

use super::loaded::Loaded;
use crate::{
    probes::plan::{self, HookFact, PlannedProbe},
    probes::{pinned::Pinned, roles, uprobe_session, ProbePlacement},
    tracee::{allocators::Hooked, elf::FileId},
};

pub(super) const RETURN_PROGRAM: &str = program::ALLOC_RETURN;

/// How `attach` places and attaches probes.
#[derive(Clone, Copy, Debug)]
pub struct AttachOptions {
    pub placement: ProbePlacement,
    /// No-op programs instead of the real ones (benchmark floors).
    pub noop: bool,
    /// Try uprobe session programs for the allocating functions.
    pub sessions: bool,
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
    let pinned = Pinned::open(&object.host_path, object.id)?;
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
    load_session_programs(loaded)?;

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

pub(super) fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &str) -> anyhow::Result<&'a mut UProbe> {
    Ok(ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?)
}

/// Loads the session copies of the allocating functions' programs, the
/// dispatcher that is attached, and free's uprobe_multi copies, once per
/// trace (ahead of it when its programs are: ahead.rs).
pub(super) fn load_session_programs(loaded: &mut Loaded) -> anyhow::Result<()> {
    if !loaded.session_progs.is_empty() {
        return Ok(());
    }
    // The kernel lets a session program tail-call only programs of the
    // same attach type: load session copies of the real programs.
    let session_roles: Vec<Role> = Role::ALL.into_iter().filter(|r| *r != Role::Free).collect();
    let mut names: Vec<&str> = session_roles
        .iter()
        .map(|&r| roles::of(r).program)
        .collect();
    names.push(RETURN_PROGRAM);
    let mut copies = uprobe_session::load_copies(&loaded.object, &names, &loaded.map_fds, true)?;
    // Kept only once all of them loaded: a part would look complete.
    let mut progs = Vec::new();
    for (role, name) in session_roles.iter().zip(&names) {
        let fd = copies.remove(*name).context("session copy")?;
        uprobe_session::set_prog_slot(loaded.progs_fd, *role as u32, &fd)?;
        progs.push(fd);
    }
    let ret = copies.remove(RETURN_PROGRAM).context("session copy")?;
    uprobe_session::set_prog_slot(loaded.progs_fd, uprobe_session::RETURN_SLOT, &ret)?;
    progs.push(ret);
    // The dispatcher last: it is the one that is attached.
    progs.push(uprobe_session::load_dispatcher(loaded.progs_fd)?);
    loaded.session_progs = progs;
    // free as a uprobe_multi link where the kernel takes one (it has
    // sessions, so it should): cheaper per call than a perf-event
    // uprobe (uprobe_session.rs). If not, a plain uprobe.
    let frees = [roles::of(Role::Free).program, roles::FREE_GLIBC_PROGRAM];
    loaded.free_multi = uprobe_session::load_copies(&loaded.object, &frees, &loaded.map_fds, false)
        .unwrap_or_default();
    Ok(())
}
