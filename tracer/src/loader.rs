//! Loading the BPF object and attaching it from a declarative table.

use std::{collections::HashMap, num::NonZeroU32, path::Path};

use anyhow::Context as _;
use aya::{
    maps::{MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{uprobe::UProbeScope, UProbe},
    Ebpf, EbpfLoader,
};
use tracer_common::Role;

use crate::{error::TraceError, report::Hook};

/// The BPF object built by build.rs from tracer-ebpf.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memtrace"));

/// One allocator entry point to hook.
pub struct HookSpec {
    pub symbol: &'static str,
    pub role: Role,
    /// Whether the function returns an allocation (gets `alloc_return`).
    pub returns_block: bool,
    /// Tracing is meaningless without it.
    pub required: bool,
}

const fn hook(symbol: &'static str, role: Role, required: bool) -> HookSpec {
    HookSpec {
        symbol,
        role,
        returns_block: !matches!(role, Role::Free),
        required,
    }
}

/// glibc's allocator. Optional entries are skipped with a note when absent.
pub const GLIBC_HOOKS: &[HookSpec] = &[
    hook("malloc", Role::Malloc, true),
    hook("free", Role::Free, true),
    // Every glibc has these, but a libc-compatible allocator might not.
    hook("calloc", Role::Calloc, false),
    hook("realloc", Role::Realloc, false),
    // glibc >= 2.26.
    hook("reallocarray", Role::ReallocArray, false),
    hook("posix_memalign", Role::PosixMemalign, false),
    // C11; an alias of memalign in some glibc versions (deduplicated below).
    hook("aligned_alloc", Role::AlignedAlloc, false),
    // Obsolete interfaces, still exported by glibc.
    hook("memalign", Role::Memalign, false),
    hook("valloc", Role::Valloc, false),
    hook("pvalloc", Role::Pvalloc, false),
];

const RETURN_PROGRAM: &str = "alloc_return";

/// The entry program in tracer-ebpf for each role.
fn entry_program(role: Role) -> &'static str {
    match role {
        Role::Malloc => "malloc_enter",
        Role::Calloc => "calloc_enter",
        Role::Realloc => "realloc_enter",
        Role::ReallocArray => "reallocarray_enter",
        Role::Free => "free_enter",
        Role::PosixMemalign => "posix_memalign_enter",
        Role::AlignedAlloc => "aligned_alloc_enter",
        Role::Memalign => "memalign_enter",
        Role::Valloc => "valloc_enter",
        Role::Pvalloc => "pvalloc_enter",
    }
}

/// Map sizes chosen on the command line.
pub struct Limits {
    pub max_live: u32,
    pub stack_storage_size: u32,
    pub ringbuf_bytes: u32,
}

/// The loaded object and the maps user space reads.
pub struct Loaded {
    /// Dropping this detaches every probe.
    pub ebpf: Ebpf,
    pub events: RingBuf<MapData>,
    pub stacks: StackTraceMap<MapData>,
    pub counters: PerCpuArray<MapData, u64>,
}

pub fn load(limits: &Limits) -> anyhow::Result<Loaded> {
    raise_memlock_limit();
    let mut ebpf = EbpfLoader::new()
        .map_max_entries("LIVE", limits.max_live)
        .map_max_entries("STACKS", limits.stack_storage_size)
        .map_max_entries("EVENTS", limits.ringbuf_bytes)
        .load(BPF_OBJECT)
        .context("loading the BPF object into the kernel")?;
    let events = RingBuf::try_from(take(&mut ebpf, "EVENTS")?)?;
    let stacks = StackTraceMap::try_from(take(&mut ebpf, "STACKS")?)?;
    let counters = PerCpuArray::try_from(take(&mut ebpf, "COUNTERS")?)?;
    for (name, prog) in ebpf.programs_mut() {
        let prog: &mut UProbe = prog.try_into()?;
        prog.load()
            .with_context(|| format!("verifying BPF program {name}"))?;
    }
    Ok(Loaded {
        ebpf,
        events,
        stacks,
        counters,
    })
}

fn take(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<aya::maps::Map> {
    ebpf.take_map(name)
        .with_context(|| format!("BPF object has no map {name}"))
}

/// Locked-memory limits no longer apply to BPF on kernels >= 5.11 (memory is
/// charged to the cgroup), and raising it needs CAP_SYS_RESOURCE, which this
/// machine lacks: try, and ignore failure.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass and nothing else.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// Attaches `specs` to the object at `host_path` (shown as `display_path`)
/// for process `pid`. Returns one `Hook` line per spec for the report.
pub fn attach(
    loaded: &mut Loaded,
    specs: &[HookSpec],
    host_path: &Path,
    display_path: &str,
    pid: u32,
) -> anyhow::Result<Vec<Hook>> {
    let names: Vec<&str> = specs.iter().map(|s| s.symbol).collect();
    let offsets = crate::target::function_offsets(host_path, &names)?;
    let pid = NonZeroU32::new(pid).context("pid 0 cannot be traced")?;
    let mut hooked_at: HashMap<u64, &str> = HashMap::new();
    let mut hooks = Vec::new();
    for spec in specs {
        let mut hook = Hook {
            function: spec.symbol.to_string(),
            module: display_path.to_string(),
            offset: 0,
            status: String::new(),
        };
        let Some(&offset) = offsets.get(spec.symbol) else {
            if spec.required {
                return Err(TraceError::MissingRequired {
                    path: display_path.to_string(),
                    symbol: spec.symbol,
                }
                .into());
            }
            hook.status = "not defined in this object".into();
            hooks.push(hook);
            continue;
        };
        hook.offset = offset;
        // Two probes on one address would both fire for every call.
        if let Some(first) = hooked_at.get(&offset) {
            hook.status = format!("alias of {first}, counted there");
            hooks.push(hook);
            continue;
        }
        attach_one(loaded, entry_program(spec.role), offset, host_path, pid)?;
        if spec.returns_block {
            attach_one(loaded, RETURN_PROGRAM, offset, host_path, pid)?;
        }
        hooked_at.insert(offset, spec.symbol);
        hook.status = "attached".into();
        hooks.push(hook);
    }
    Ok(hooks)
}

fn attach_one(
    loaded: &mut Loaded,
    program: &str,
    offset: u64,
    path: &Path,
    pid: NonZeroU32,
) -> anyhow::Result<()> {
    let prog: &mut UProbe = loaded
        .ebpf
        .program_mut(program)
        .with_context(|| format!("BPF object has no program {program}"))?
        .try_into()?;
    prog.attach(offset, path, UProbeScope::OneProcess(pid))
        .with_context(|| format!("attaching {program} at {}+{offset:#x}", path.display()))?;
    Ok(())
}
