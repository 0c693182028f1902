//! Attaching as a plan first: which entry point of an object gets probes
//! and where, and which are skipped and why. Reads the object's code for
//! placement but touches no BPF; `loader::attach` carries the plan out.

use std::{collections::HashMap, fmt, path::Path};

use anyhow::Context as _;
use iced_x86::Register;
use tracer_common::Role;

use crate::{
    error::TraceError,
    probes::ProbePlacement,
    probes::{placement, roles},
    tracee::allocators::Hooked,
    tracee::elf::{ObjectInfo, Thunk},
    tracee::entry_points::{EntryPoint, CORE},
};

/// Why an entry point gets no probe of its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skip {
    /// The object does not define it.
    NotDefined,
    /// Same address as `of`, whose probe counts the call (two probes on one
    /// address would both fire for every call).
    Alias { of: String },
    /// Only jumps to `to` (through the PLT when `plt`), whose probe counts
    /// the call.
    Thunk { to: String, plt: bool },
}

/// What became of one entry point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookStatus {
    /// Probed; `session` when as part of a uprobe session link.
    Attached {
        session: bool,
    },
    Skipped(Skip),
}

impl HookStatus {
    pub fn is_attached(&self) -> bool {
        matches!(self, HookStatus::Attached { .. })
    }
}

/// The report's words for a status (its JSON `status` field).
impl fmt::Display for HookStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookStatus::Attached { session: false } => f.write_str("attached"),
            HookStatus::Attached { session: true } => f.write_str("attached (uprobe session)"),
            HookStatus::Skipped(Skip::NotDefined) => f.write_str("not defined in this object"),
            HookStatus::Skipped(Skip::Alias { of }) => write!(f, "alias of {of}, counted there"),
            HookStatus::Skipped(Skip::Thunk { to, plt: true }) => {
                write!(f, "jumps to {to} through the PLT, counted there")
            }
            HookStatus::Skipped(Skip::Thunk { to, plt: false }) => {
                write!(f, "jumps to {to}, counted there")
            }
        }
    }
}

/// One entry point of one object, as attached (or not): the fact the
/// session hands to the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookFact {
    pub function: String,
    /// Path of the object as the process sees it.
    pub module: String,
    /// File offset of the symbol (0 when not defined).
    pub offset: u64,
    /// File offset of the probes and why there (0 and "" when none).
    pub probe_offset: u64,
    pub placement: String,
    pub status: HookStatus,
}

/// Where one entry point's probes go: as plain uprobes (`plain`: file
/// offset and why), and as a uprobe session program (`session`), which may
/// sit past instructions that moved an argument because its attach cookie
/// (`cookie`: role and argument locations, see tracer_common::cookie) tells
/// the program where the argument went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub plain: (u64, String),
    pub session: (u64, String),
    pub cookie: u64,
}

/// One entry point of an object and what to do with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedProbe {
    pub function: String,
    pub role: Role,
    /// File offset of the symbol (0 when not defined).
    pub offset: u64,
    /// Ok: probe it there; Err: why not.
    pub action: Result<Placed, Skip>,
}

impl PlannedProbe {
    pub fn placed(&self) -> Option<&Placed> {
        self.action.as_ref().ok()
    }

    /// The fact for the report, once attached (`session`: as part of a
    /// uprobe session link; free never is).
    pub fn fact(&self, module: &str, session: bool) -> HookFact {
        let (status, (probe_offset, placement)) = match &self.action {
            Ok(placed) if session && self.role != Role::Free => (
                HookStatus::Attached { session: true },
                placed.session.clone(),
            ),
            Ok(placed) => (
                HookStatus::Attached { session: false },
                placed.plain.clone(),
            ),
            Err(skip) => (HookStatus::Skipped(skip.clone()), (0, String::new())),
        };
        HookFact {
            function: self.function.clone(),
            module: module.to_string(),
            offset: self.offset,
            probe_offset,
            placement,
            status,
        }
    }
}

/// Plans the probes of `object`: one `PlannedProbe` per entry point it
/// lists, plus, for the object malloc resolves to, the C functions it
/// lacks (listed as not defined). Fails when that object lacks malloc or
/// free (`roles::RoleProbe::required`).
pub fn plan(object: &Hooked, placement: ProbePlacement) -> anyhow::Result<Vec<PlannedProbe>> {
    let display_path = object.path.to_string_lossy();
    let info = &object.info;
    let mut listed: Vec<EntryPoint> = object.entry_points.clone();
    if object.resolves_malloc {
        listed.extend(
            CORE.iter()
                .filter(|(n, _)| !object.entry_points.iter().any(|e| e.name == *n))
                .map(|&(n, role)| EntryPoint {
                    name: n.to_string(),
                    role,
                    standard: true,
                }),
        );
    }
    let mut probed_at: HashMap<u64, &str> = HashMap::new();
    let mut planned = Vec::with_capacity(listed.len());
    for spec in &listed {
        let required = roles::of(spec.role).required;
        let Some(&offset) = info.defined.get(&spec.name) else {
            if let Some(symbol) = required.filter(|r| object.resolves_malloc && spec.name == *r) {
                let path = display_path.to_string();
                return Err(TraceError::MissingRequired { path, symbol }.into());
            }
            planned.push(planned_probe(spec, 0, Err(Skip::NotDefined)));
            continue;
        };
        let thunk = info.thunks.get(&spec.name);
        let action = if let Some(first) = probed_at.get(&offset) {
            Err(Skip::Alias {
                of: first.to_string(),
            })
        } else if let Some(skip) = thunk.and_then(|t| counted_at(object, spec, t)) {
            Err(skip)
        } else {
            probed_at.insert(offset, &spec.name);
            Ok(place(info, &object.host_path, spec, offset, placement)?)
        };
        planned.push(planned_probe(spec, offset, action));
    }
    Ok(planned)
}

fn planned_probe(spec: &EntryPoint, offset: u64, action: Result<Placed, Skip>) -> PlannedProbe {
    PlannedProbe {
        function: spec.name.clone(),
        role: spec.role,
        offset,
        action,
    }
}

/// When entry point `spec` of `object` only jumps to another function
/// whose probe counts the call (a second probe would count it twice, and
/// both return probes would fire for one entry): why it is not probed.
fn counted_at(object: &Hooked, spec: &EntryPoint, thunk: &Thunk) -> Option<Skip> {
    let hooked_here = |name: &str, standard_only: bool| {
        object
            .entry_points
            .iter()
            .any(|e| e.name == name && e.role == spec.role && (e.standard || !standard_only))
    };
    match thunk {
        // Through the PLT it reaches the standard function of that name,
        // which is hooked here when this object is the one malloc
        // resolves to.
        Thunk::Plt(target) if object.resolves_malloc && hooked_here(target, true) => {
            Some(Skip::Thunk {
                to: target.clone(),
                plt: true,
            })
        }
        Thunk::Direct(target) if hooked_here(target, false) => Some(Skip::Thunk {
            to: target.clone(),
            plt: false,
        }),
        _ => None,
    }
}

fn place(
    info: &ObjectInfo,
    host_path: &Path,
    spec: &EntryPoint,
    offset: u64,
    how: ProbePlacement,
) -> anyhow::Result<Placed> {
    let role_cookie = spec.role as u64;
    if how == ProbePlacement::Entry {
        let at = (offset, "symbol (--probe-placement entry)".to_string());
        return Ok(Placed {
            plain: at.clone(),
            session: at,
            cookie: role_cookie,
        });
    }
    let args = roles::of(spec.role).args;
    let size = info.sizes.get(&spec.name).copied().unwrap_or(0);
    let code = read_code(host_path, offset, size)?;
    let plain = placement::place(&code, args);
    // free is never a session program: no cookie reaches it.
    let session = if spec.role == Role::Free {
        plain.clone()
    } else {
        placement::place_with(&code, args, true)
    };
    let mut cookie = role_cookie;
    for (from, to) in &session.moved {
        let index = placement::ARG_REGISTERS
            .iter()
            .position(|r| r == from)
            .context("moved a non-argument register")?;
        cookie |= register_code(*to)? << (tracer_common::cookie::ARG_SHIFT + 4 * index as u32);
    }
    Ok(Placed {
        plain: (offset + plain.offset, plain.reason),
        session: (offset + session.offset, session.reason),
        cookie,
    })
}

/// tracer_common::cookie's code for a register an argument may be in.
fn register_code(reg: Register) -> anyhow::Result<u64> {
    use tracer_common::cookie as c;
    Ok(match reg {
        Register::RDI => c::RDI,
        Register::RSI => c::RSI,
        Register::RDX => c::RDX,
        Register::RCX => c::RCX,
        Register::R8 => c::R8,
        Register::R9 => c::R9,
        Register::RAX => c::RAX,
        Register::R10 => c::R10,
        Register::R11 => c::R11,
        other => anyhow::bail!("an argument moved to {other:?}, which probes cannot read"),
    })
}

/// The function at file offset `offset`: `size` bytes (at most
/// placement::MAX_FUNCTION), or placement::WINDOW when the size is unknown.
fn read_code(path: &Path, offset: u64, size: u64) -> anyhow::Result<Vec<u8>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(SeekFrom::Start(offset))?;
    let len = match size {
        0 => placement::WINDOW as u64,
        n => n.min(placement::MAX_FUNCTION as u64),
    };
    let mut code = Vec::with_capacity(len as usize);
    file.take(len).read_to_end(&mut code)?;
    Ok(code)
}

#[cfg(test)]
mod tests;
