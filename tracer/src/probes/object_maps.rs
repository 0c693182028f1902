//! The BPF object's maps as the loader prepares them: taken out of aya's
//! object by name, duplicated fds for the session copies, the sampling
//! countdowns seeded, and `--unwind tables`' row and mapping maps.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, OwnedFd},
};

use anyhow::Context as _;
use aya::{
    maps::{Array, MapData, PerCpuArray, PerCpuValues},
    Ebpf,
};
use tracer_common::{names::map, TraceSettings};

use crate::{
    probes::{Limits, UnwindMode},
    stacks::kernel_tables::BpfUnwindMaps,
};

/// Entries of the UNWIND_MAPPINGS trie (tracer-ebpf sets the same size):
/// about 20 per executable mapping.
pub const UNWIND_MAPPINGS: u32 = 1 << 16;

/// UNWIND_ROWS and UNWIND_MAPPINGS entries: a single one each outside
/// tables mode.
pub(super) fn unwind_sizes(limits: &Limits) -> (u32, u32) {
    match limits.unwind {
        UnwindMode::Tables => (limits.unwind_rows, UNWIND_MAPPINGS),
        _ => (1, 1),
    }
}

/// Tables mode: the maps the kernel walks with, for user space to fill.
pub(super) fn take_unwind(
    ebpf: &mut Ebpf,
    limits: &Limits,
) -> anyhow::Result<Option<BpfUnwindMaps>> {
    if limits.unwind != UnwindMode::Tables {
        return Ok(None);
    }
    Ok(Some(BpfUnwindMaps::new(
        Array::try_from(take(ebpf, map::UNWIND_ROWS)?)?,
        aya::maps::LpmTrie::try_from(take(ebpf, map::UNWIND_MAPPINGS)?)?,
        Array::try_from(take(ebpf, map::STATE)?)?,
    )?))
}

/// FILTER_CGROUP: the CGROUP map, holding the traced cgroup's `id` (0
/// without --cgroup); the session writes it again when the cgroup at the
/// path given is removed and made anew.
pub(super) fn traced_cgroup(ebpf: &mut Ebpf, id: u64) -> anyhow::Result<Array<MapData, u64>> {
    let mut cgroup = Array::try_from(take(ebpf, map::CGROUP)?)?;
    cgroup.set(0, id, 0).context("setting the traced cgroup")?;
    Ok(cgroup)
}

/// Each CPU starts with its own random distance to its first sample, so
/// that the first allocation on every CPU is not recorded for certain.
pub(super) fn seed_countdowns(ebpf: &mut Ebpf, rate: u64, table: &[u32]) -> anyhow::Result<()> {
    let mut countdown: PerCpuArray<_, i64> = PerCpuArray::try_from(
        ebpf.map_mut(map::COUNTDOWN)
            .context("BPF object has no map COUNTDOWN")?,
    )?;
    let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow::anyhow!("{what}: {e}"))?;
    let values: Vec<i64> = (0..cpus)
        .map(|_| {
            crate::model::sampling::draw_interval(table, rate, crate::model::sampling::random_u32())
                as i64
        })
        .collect();
    countdown
        .set(0, PerCpuValues::try_from(values)?, 0)
        .context("seeding the sampling countdowns")?;
    Ok(())
}

pub(super) fn take(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("BPF object has no map {name}"))
}

/// Locked-memory limits no longer apply to BPF on kernels >= 5.11 (memory is
/// charged to the cgroup), and raising it needs CAP_SYS_RESOURCE, which this
/// machine lacks: try, and ignore failure.
pub(super) fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// Every map's fd, duplicated, by name (aya names data sections' maps
/// `.rodata`, `.bss`...).
pub(super) fn map_fds(ebpf: &Ebpf) -> anyhow::Result<HashMap<String, OwnedFd>> {
    use aya::maps::Map;
    let mut fds = HashMap::new();
    for (name, map) in ebpf.maps() {
        let data = match map {
            Map::Array(d)
            | Map::PerCpuArray(d)
            | Map::HashMap(d)
            | Map::LruHashMap(d)
            | Map::RingBuf(d)
            | Map::StackTraceMap(d)
            | Map::LpmTrie(d)
            | Map::ProgramArray(d)
            // INFLIGHT, task storage (see loader.rs).
            | Map::Unsupported(d) => d,
            _ => continue,
        };
        fds.insert(name.to_string(), data.fd().as_fd().try_clone_to_owned()?);
    }
    Ok(fds)
}

/// `Loaded::code_gen` of programs loaded ahead until a trace is given to
/// them (loader/ahead.rs).
pub(super) const NOT_ARMED: &str = "not attached: no trace was given to the programs yet";

/// Writes `TraceSettings::IDLE` (records nothing) into freshly loaded
/// programs' SETTINGS map.
pub(super) fn idle_settings(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    settings_map(ebpf)?
        .set(0, TraceSettings::IDLE, 0)
        .context("writing the idle settings")
}

pub(super) fn settings_map(ebpf: &mut Ebpf) -> anyhow::Result<Array<&mut MapData, TraceSettings>> {
    Ok(Array::try_from(
        ebpf.map_mut(map::SETTINGS)
            .context("BPF object has no map SETTINGS")?,
    )?)
}
