//! A program of the BPF object made loadable by the bpf(2) syscall alone:
//! its instructions with map and global references relocated to aya's
//! maps, and the `.text` functions it calls appended.

use std::{
    collections::HashMap,
    os::fd::{AsRawFd, OwnedFd},
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

use anyhow::{bail, Context as _};

use super::insn::{Insn, BPF_PSEUDO_MAP_FD};
use crate::probes::kernel_btf;

fn insns_of(bytes: &[u8]) -> Vec<Insn> {
    bytes
        .chunks_exact(8)
        .map(|c| Insn {
            code: c[0],
            regs: c[1],
            off: i16::from_le_bytes([c[2], c[3]]),
            imm: i32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect()
}

/// The instructions of function symbol `name`, relocated, with any `.text`
/// callees appended; and, when it takes a function's address (a bpf_loop
/// callback), where its subprograms start, for their BTF function info.
pub(super) fn relocated_program<'a>(
    file: &object::File<'a>,
    name: &str,
    map_fds: &HashMap<String, OwnedFd>,
) -> anyhow::Result<(Vec<Insn>, Option<Subprograms>)> {
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name) && s.kind() == object::SymbolKind::Text)
        .context("no such function")?;
    let section = file.section_by_index(sym.section_index().context("no section")?)?;
    let mut calls = Vec::new();
    let mut insns = relocate(
        file,
        &section,
        sym.address(),
        sym.size(),
        map_fds,
        &mut calls,
    )?;
    // Append the callees, and theirs (a call graph without cycles: BPF has
    // no recursion), each once.
    let takes_address = calls.iter().any(|c| c.2);
    let btf = object_btf(file)?;
    let mut appended: HashMap<String, (usize, Option<u32>)> = HashMap::new();
    let mut pending = calls;
    while let Some((at, callee, by_address)) = pending.pop() {
        let start = match appended.get(&callee) {
            Some(&(start, _)) => start,
            None => {
                let csym = file
                    .symbols()
                    .find(|s| {
                        s.name() == Ok(callee.as_str()) && s.kind() == object::SymbolKind::Text
                    })
                    .with_context(|| format!("no callee {callee}"))?;
                let csec = file.section_by_index(csym.section_index().context("no section")?)?;
                let mut nested = Vec::new();
                let body = relocate(
                    file,
                    &csec,
                    csym.address(),
                    csym.size(),
                    map_fds,
                    &mut nested,
                )?;
                let start = insns.len();
                // The callee's calls, at their places in the whole program.
                pending.extend(nested.into_iter().map(|(n, c, b)| (n + start, c, b)));
                insns.extend(body);
                let global = btf.global_function_params(&callee)?;
                appended.insert(callee, (start, global));
                start
            }
        };
        let kind = if by_address {
            BPF_PSEUDO_FUNC
        } else {
            BPF_PSEUDO_CALL
        };
        insns[at].regs = (kind << 4) | (insns[at].regs & 0x0f);
        insns[at].imm = (start as i64 - at as i64 - 1) as i32;
    }
    // Function info is needed where a function's address is taken, and
    // where a callee is global (or the verifier takes it for static and
    // checks it again at every call).
    let any_global = appended.values().any(|&(_, global)| global.is_some());
    let subprograms = (takes_address || any_global).then(|| {
        let mut starts: Subprograms = std::iter::once((0, None))
            .chain(appended.into_values())
            .collect();
        starts.sort_unstable();
        starts
    });
    Ok((insns, subprograms))
}

/// The name of the function at `addr` in the section of symbol `target`.
fn function_at(
    file: &object::File<'_>,
    target: &object::Symbol<'_, '_>,
    addr: u64,
) -> anyhow::Result<String> {
    file.symbols()
        .find(|s| {
            s.address() == addr
                && s.kind() == object::SymbolKind::Text
                && s.section_index() == target.section_index()
        })
        .and_then(|s| s.name().ok().map(str::to_string))
        .with_context(|| format!("no function at .text+{addr:#x}"))
}

/// The BTF of the BPF object `file`.
fn object_btf<'a>(file: &object::File<'a>) -> anyhow::Result<kernel_btf::Btf<'a>> {
    use object::ObjectSection as _;
    let section = file
        .section_by_name(".BTF")
        .context("the BPF object has no .BTF section")?;
    kernel_btf::Btf::parse(section.data()?).context("parsing the BPF object's BTF")
}

/// Where each subprogram starts (instruction index) and, for a global
/// function, how many integer parameters it takes; the program first.
type Subprograms = Vec<(usize, Option<u32>)>;

const BPF_PSEUDO_CALL: u8 = 1;
/// A function's address loaded into a register (a bpf_loop callback).
const BPF_PSEUDO_FUNC: u8 = 4;
const BPF_PSEUDO_MAP_VALUE: u8 = 2;

/// Instructions of [start, start + size) of `section` with map and global
/// references relocated; calls into other functions are returned in `calls`
/// as (instruction index, callee name, whether the instruction loads the
/// callee's address rather than calling it).
fn relocate(
    file: &object::File<'_>,
    section: &object::Section<'_, '_>,
    start: u64,
    size: u64,
    map_fds: &HashMap<String, OwnedFd>,
    calls: &mut Vec<(usize, String, bool)>,
) -> anyhow::Result<Vec<Insn>> {
    let data = section.data()?;
    let bytes = data
        .get(start as usize..(start + size) as usize)
        .context("function outside its section")?;
    let mut insns = insns_of(bytes);
    for (offset, reloc) in section.relocations() {
        if offset < start || offset >= start + size {
            continue;
        }
        let at = ((offset - start) / 8) as usize;
        let object::RelocationTarget::Symbol(index) = reloc.target() else {
            bail!("relocation at {offset:#x} without a symbol");
        };
        let target = file.symbol_by_index(index)?;
        let target_section = target
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .and_then(|s| s.name().ok().map(str::to_string))
            .unwrap_or_default();
        let target_name = target.name().unwrap_or("").to_string();
        if target.is_undefined() {
            // A kfunc, its call already resolved (object_patch.rs).
            continue;
        }
        if insns[at].code == 0x85 {
            // A call relocated against its section's symbol (as LLVM does
            // for some local calls) names its callee by the immediate:
            // the callee starts (imm + 1) instructions past the symbol.
            let callee = if target_name.is_empty() {
                let addr = target
                    .address()
                    .wrapping_add((i64::from(insns[at].imm) + 1).wrapping_mul(8) as u64);
                function_at(file, &target, addr)?
            } else {
                target_name
            };
            calls.push((at, callee, false));
            continue;
        }
        if insns[at].code == 0x18 && target_section == ".text" && at + 1 < insns.len() {
            // A function's address (bpf_loop's callback), against the
            // section symbol: the byte offset in .text is in the immediate.
            let addr = target.address() + insns[at].imm as u64;
            let callee = function_at(file, &target, addr)?;
            insns[at + 1].imm = 0;
            calls.push((at, callee, true));
            continue;
        }
        if insns[at].code != 0x18 || at + 1 >= insns.len() {
            bail!("unexpected relocation at {offset:#x} for {target_name}");
        }
        if target_section == "maps" || target_section == ".maps" {
            let fd = map_fds
                .get(&target_name)
                .with_context(|| format!("no map {target_name}"))?;
            insns[at].regs = (BPF_PSEUDO_MAP_FD << 4) | (insns[at].regs & 0x0f);
            insns[at].imm = fd.as_raw_fd();
        } else if target_section == ".rodata" {
            let fd = map_fds.get(".rodata").context("no .rodata map")?;
            let addend = i64::from(insns[at].imm) + target.address() as i64;
            insns[at].regs = (BPF_PSEUDO_MAP_VALUE << 4) | (insns[at].regs & 0x0f);
            insns[at].imm = fd.as_raw_fd();
            insns[at + 1].imm = addend as i32;
        } else {
            bail!("relocation against {target_name} in {target_section}");
        }
    }
    Ok(insns)
}
