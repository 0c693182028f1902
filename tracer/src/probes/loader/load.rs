//! Loading the BPF object in the best unwind mode the kernel's verifier
//! accepts, with the maps sized and the globals set for this trace and
//! this kernel.

use std::{collections::HashMap, os::fd::AsFd as _, os::fd::AsRawFd as _};

use anyhow::{bail, Context as _};
use aya::{
    maps::{Array, PerCpuArray, RingBuf, StackTraceMap},
    programs::{Program, UProbe},
    Ebpf, EbpfLoader, VerifierLogLevel,
};
use tracer_common::{
    names::{global, map},
    LiveKey, LiveValue,
};

use super::{
    kernel_programs::{arm, CODE_GEN_SYSCALL_PROGRAM},
    loaded::{EventMaps, Loaded},
};
use crate::{
    console, escape,
    probes::object_maps::{self, map_fds, raise_memlock_limit, seed_countdowns, take},
    probes::{
        kernel_features::KernelFeatures, links::Links, map_count::MapCounter, object_patch,
        verifier::Rejected,
    },
    probes::{Limits, UnwindMode},
};

/// The BPF object built by build.rs from tracer-ebpf.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace"));

/// The BPF object as built (for tests of what reads it).
#[cfg(test)]
pub(crate) fn bpf_object() -> &'static [u8] {
    BPF_OBJECT
}

/// Entries of the TRACED map (tracer-ebpf sets the same size).
pub const MAX_FILTERED_PIDS: u32 = 8192;

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
    let table = crate::model::sampling::exp_table();
    let mut ebpf = load_object(limits, features, object, &table, verbose)?;
    let map_fds = map_fds(&ebpf)?;
    let maps = take_event_maps(&mut ebpf, limits)?;
    let counters = PerCpuArray::try_from(take(&mut ebpf, map::COUNTERS)?)?;
    let control = Array::try_from(take(&mut ebpf, map::CONTROL)?)?;
    let traced = aya::maps::HashMap::try_from(take(&mut ebpf, map::TRACED)?)?;
    let cgroup = object_maps::traced_cgroup(&mut ebpf, limits.cgroup.id)?;
    let progs_fd = map_fds
        .get(map::PROGS)
        .context("BPF object has no map PROGS")?
        .as_raw_fd();
    seed_countdowns(&mut ebpf, limits.sampling.rate(), &table)?;
    let verified = load_programs(&mut ebpf, &features.release, unwind.name())?;
    // Programs loaded ahead of a trace attach nothing until one is given
    // to them (ahead.rs): until then the host runs none of them.
    let code_gen = if limits.settings_in_map {
        object_maps::idle_settings(&mut ebpf)?;
        Err(object_maps::NOT_ARMED.into())
    } else {
        arm(&mut ebpf)?
    };
    Ok((
        Loaded {
            ebpf: Some(ebpf),
            counters,
            control,
            control_bits: 0,
            progs_fd,
            map_fds,
            session_progs: Vec::new(),
            links: Links::default(),
            free_multi: HashMap::new(),
            session_error: None,
            code_gen,
            traced,
            cgroup,
            unwind,
            features: features.clone(),
            object: std::sync::Arc::clone(object),
            fallback: None,
            loaded_ahead: false,
            verified,
        },
        maps,
    ))
}

/// Creates the object's maps, sized for this trace, and its globals, set
/// for this trace and this kernel; the programs are loaded afterwards.
fn load_object(
    limits: &Limits,
    features: &KernelFeatures,
    object: &[u8],
    table: &[u32],
    verbose: bool,
) -> anyhow::Result<Ebpf> {
    let (mode, stack_entries) = match limits.unwind {
        UnwindMode::Fp => (tracer_common::UNWIND_FP, limits.stack_storage_size),
        // The kernel stack map is not used: keep it minimal.
        UnwindMode::Dwarf => (tracer_common::UNWIND_DWARF, 1),
        UnwindMode::Tables => (tracer_common::UNWIND_TABLES, 1),
    };
    let (unwind_rows, unwind_mappings) = object_maps::unwind_sizes(limits);
    let forks = fork_tunables(limits)?;
    let inflight_by_tid = u32::from(!features.task_storage);
    let attach_cookies = u32::from(features.attach_cookie);
    let atomic_slots = u32::from(features.atomics);
    let cgroup_helper = u32::from(features.ancestor_cgroup);
    // Statistics and the error's own lines only: a verbose log of a large
    // program runs to megabytes, and aya retries a load with a larger
    // buffer each time the log does not fit, verifying it again.
    let log_level = if verbose {
        VerifierLogLevel::DEBUG | VerifierLogLevel::STATS
    } else {
        VerifierLogLevel::STATS
    };
    EbpfLoader::new()
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
            if limits.sampling.is_exact() || limits.settings_in_map {
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
        .override_global(global::EXP_TABLE, table, true)
        .override_global(global::FOLLOW_FORKS, &forks.follow, true)
        .override_global(global::TASK_TGID_OFFSET, &forks.tgid_offset, true)
        .override_global(global::TASK_START_OFFSET, &forks.start_offset, true)
        .override_global(global::EXIT_GROUP_DEAD, &forks.exit_group_dead, true)
        .override_global(global::INFLIGHT_BY_TID, &inflight_by_tid, true)
        .override_global(global::ATTACH_COOKIES, &attach_cookies, true)
        .override_global(global::ATOMIC_SLOTS, &atomic_slots, true)
        .override_global(
            global::SETTINGS_IN_MAP,
            &u32::from(limits.settings_in_map),
            true,
        )
        .override_global(global::CGROUP_HELPER, &cgroup_helper, true)
        .load(object)
        .context("loading the BPF object into the kernel")
}

/// Takes the maps the collector reads out of the loaded object.
fn take_event_maps(ebpf: &mut Ebpf, limits: &Limits) -> anyhow::Result<EventMaps> {
    let events = RingBuf::try_from(take(ebpf, map::EVENTS)?)?;
    let stacks = StackTraceMap::try_from(take(ebpf, map::STACKS)?)?;
    let live = take(ebpf, map::LIVE)?;
    let live_count = match &live {
        aya::maps::Map::HashMap(data) => MapCounter::new(
            data.fd().as_fd().try_clone_to_owned()?,
            std::mem::size_of::<LiveKey>(),
            std::mem::size_of::<LiveValue>(),
        ),
        _ => anyhow::bail!("LIVE is not a hash map"),
    };
    let live = aya::maps::HashMap::try_from(live)?;
    let unwind_maps = object_maps::take_unwind(ebpf, limits)?;
    let code_gens = crate::stacks::modules::BpfCodeGens::new(
        take(ebpf, map::MAPS_GEN)?,
        take(ebpf, map::MAPS_READ)?,
    )?;
    Ok(EventMaps {
        events,
        stacks,
        live,
        live_count,
        unwind: unwind_maps,
        code_gens: Some(code_gens),
    })
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
    start_offset: u32,
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
                start_offset: 0,
                exit_group_dead: 0,
            })
        }
    };
    Ok(ForkTunables {
        follow,
        tgid_offset: facts.tgid_offset,
        start_offset: facts.start_offset,
        exit_group_dead: u32::from(facts.exit_has_group_dead),
    })
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
