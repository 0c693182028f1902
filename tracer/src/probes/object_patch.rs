//! The BPF object as the running kernel can load it: kfunc calls resolved
//! against its BTF (below). Where the kernel has no task-local storage
//! (before 5.11), INFLIGHT, a task storage map, is
//! defined as a hash map instead (its key, a u32, is then the thread id,
//! and tracer-ebpf's INFLIGHT_BY_TID global switches its programs over):
//! a BTF map's type is the element count of the array its `type` member
//! points to, rewritten in place in the object's .BTF section. aya creates
//! every map of an object, so a map the kernel cannot create fails the
//! whole load otherwise.

use anyhow::{bail, Context as _};
use object::{Object as _, ObjectSection as _};
use tracer_common::names::map;

use super::{kernel_btf::Btf, kernel_features::KernelFeatures};

const BPF_MAP_TYPE_HASH: u32 = 1;
/// `call imm` (BPF_JMP | BPF_CALL) and `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
const BPF_CALL: u8 = 0x85;
const BPF_MOV64_IMM: u8 = 0xb7;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const BPF_MAP_TYPE_TASK_STORAGE: u32 = 29;

/// Threads whose calls in flight a hash INFLIGHT holds at once (each
/// entry about 0.25 KiB, allocated on a thread's first traced call and
/// freed at its exit); a thread past it is counted as INFLIGHT_FULL.
const INFLIGHT_THREADS: u32 = 1 << 16;

/// INFLIGHT's max_entries: 0 for task storage (required), else threads.
pub fn inflight_entries(features: &KernelFeatures) -> u32 {
    if features.task_storage {
        0
    } else {
        INFLIGHT_THREADS
    }
}

/// `object` as this kernel loads it: its kfunc calls made calls of this
/// kernel's kfuncs (or no-ops where it has none), and INFLIGHT a hash map
/// where it lacks task storage.
pub fn for_kernel(object: &[u8], features: &KernelFeatures) -> anyhow::Result<Vec<u8>> {
    let mut patched = object.to_vec();
    patch_kfunc_calls(&mut patched, features.preempt_kfuncs)?;
    if !features.atomics {
        drop_atomic_fetches(&mut patched)?;
    }
    if features.task_storage {
        return Ok(patched);
    }
    let at = map_type_at(object, map::INFLIGHT)?;
    let word = patched
        .get_mut(at..at + 4)
        .context("INFLIGHT's map type lies outside the object")?;
    let old = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    anyhow::ensure!(
        old == BPF_MAP_TYPE_TASK_STORAGE,
        "INFLIGHT is defined with map type {old}, not task storage"
    );
    word.copy_from_slice(&BPF_MAP_TYPE_HASH.to_le_bytes());
    Ok(patched)
}

/// bpf-linker leaves a call of a kfunc as `call -1` relocated against the
/// undefined symbol, which aya would try to link as a BPF function. Each
/// becomes a kfunc call (source register BPF_PSEUDO_KFUNC_CALL, the
/// kfunc's BTF id in the immediate) where the kernel has the kfunc, else
/// `r0 = 0` (the program then runs without it; the call clobbered r0
/// anyway). The relocations stay: aya and the session loader pass over
/// relocations of undefined symbols at instructions that are not calls of
/// BPF functions.
fn patch_kfunc_calls(object: &mut [u8], preempt: Option<(u32, u32)>) -> anyhow::Result<()> {
    let sites = kfunc_call_sites(object)?;
    for (at, name) in sites {
        let id = match (name.as_str(), preempt) {
            ("bpf_preempt_disable", Some((disable, _))) => Some(disable),
            ("bpf_preempt_enable", Some((_, enable))) => Some(enable),
            ("bpf_preempt_disable" | "bpf_preempt_enable", None) => None,
            (other, _) => {
                bail!("the BPF object calls kfunc {other}, which the loader does not know")
            }
        };
        let insn = object
            .get_mut(at..at + 8)
            .context("a kfunc call lies outside the object")?;
        anyhow::ensure!(
            insn[0] == BPF_CALL,
            "the relocation of {name} is not at a call"
        );
        match id {
            Some(id) => {
                insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
                insn[2..4].copy_from_slice(&0u16.to_le_bytes());
                insn[4..8].copy_from_slice(&id.to_le_bytes());
            }
            None => insn.copy_from_slice(&[BPF_MOV64_IMM, 0, 0, 0, 0, 0, 0, 0]),
        }
    }
    Ok(())
}

/// Kernels before 5.12 refuse a program holding any atomic operation but
/// add, reachable or not ("BPF_STX uses reserved fields"). The programs
/// use fetch-or and fetch-and only where ATOMIC_SLOTS says the kernel has
/// them (tracer-ebpf scratch.rs), so elsewhere those instructions are dead
/// code: each becomes `src = 0`, which the old verifier checks no further.
fn drop_atomic_fetches(object: &mut [u8]) -> anyhow::Result<()> {
    const ATOMIC_W: u8 = 0xc3; // BPF_STX | BPF_W | BPF_ATOMIC
    const ATOMIC_DW: u8 = 0xdb; // BPF_STX | BPF_DW | BPF_ATOMIC
    for (start, end) in program_ranges(object)? {
        let Some(code) = object.get_mut(start..end) else {
            continue;
        };
        for insn in code.chunks_exact_mut(8) {
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if matches!(insn[0], ATOMIC_W | ATOMIC_DW) && imm != 0 {
                let src = insn[1] >> 4;
                insn.copy_from_slice(&[BPF_MOV64_IMM, src, 0, 0, 0, 0, 0, 0]);
            }
        }
    }
    Ok(())
}

/// File ranges of the object's executable sections (programs, `.text`).
fn program_ranges(object: &[u8]) -> anyhow::Result<Vec<(usize, usize)>> {
    let file = object::File::parse(object).context("parsing the BPF object")?;
    let mut ranges = Vec::new();
    for section in file.sections() {
        if section.kind() != object::SectionKind::Text {
            continue;
        }
        if let Some((start, size)) = section.file_range() {
            ranges.push((usize::try_from(start)?, usize::try_from(start + size)?));
        }
    }
    Ok(ranges)
}

/// File offsets of the instructions relocated against undefined symbols
/// (kfuncs), with the symbol's name.
fn kfunc_call_sites(object: &[u8]) -> anyhow::Result<Vec<(usize, String)>> {
    use object::{ObjectSymbol as _, RelocationTarget};
    let file = object::File::parse(object).context("parsing the BPF object")?;
    let mut sites = Vec::new();
    for section in file.sections() {
        let Some((base, _)) = section.file_range() else {
            continue;
        };
        for (offset, reloc) in section.relocations() {
            let RelocationTarget::Symbol(index) = reloc.target() else {
                continue;
            };
            let symbol = file.symbol_by_index(index)?;
            if !symbol.is_undefined() {
                continue;
            }
            let at = usize::try_from(base + offset)?;
            sites.push((at, symbol.name()?.to_string()));
        }
    }
    Ok(sites)
}

/// The file offset of BTF map `var`'s type word in ELF `object`.
fn map_type_at(object: &[u8], var: &str) -> anyhow::Result<usize> {
    let file = object::File::parse(object).context("parsing the BPF object")?;
    let section = file
        .section_by_name(".BTF")
        .context("the BPF object has no .BTF section")?;
    let (offset, size) = section
        .file_range()
        .context("the BPF object's .BTF section has no file data")?;
    let (offset, size) = (usize::try_from(offset)?, usize::try_from(size)?);
    let data = object
        .get(offset..offset + size)
        .context(".BTF lies outside the object")?;
    let btf = Btf::parse(data).context("parsing the BPF object's BTF")?;
    let at = btf
        .map_type_offset(var)
        .with_context(|| format!("the BPF object's BTF does not define map {var}"))?;
    Ok(offset + at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(task_storage: bool) -> KernelFeatures {
        KernelFeatures {
            release: "5.10.0-test".into(),
            task_storage,
            attach_cookie: false,
            uprobe_multi: false,
            uprobe_session: false,
            atomics: false,
            ancestor_cgroup: false,
            preempt_kfuncs: None,
        }
    }

    fn map_types(object: &[u8]) -> Vec<(String, u32)> {
        let obj = aya_obj::Object::parse(object).expect("parse");
        let mut types: Vec<(String, u32)> = obj
            .maps
            .iter()
            .map(|(name, map)| (name.clone(), map.map_type()))
            .collect();
        types.sort();
        types
    }

    #[test]
    fn without_task_storage_only_inflight_becomes_a_hash_map() {
        let object = super::super::loader::bpf_object();
        let before = map_types(object);
        let patched = for_kernel(object, &features(false)).expect("patch");
        let after = map_types(&patched);
        for ((name, old), (_, new)) in before.iter().zip(&after) {
            if name == map::INFLIGHT {
                assert_eq!((*old, *new), (BPF_MAP_TYPE_TASK_STORAGE, BPF_MAP_TYPE_HASH));
            } else {
                assert_eq!(old, new, "{name}");
            }
        }
        assert!(before.iter().any(|(n, _)| n == map::INFLIGHT));
    }

    /// The instruction at each kfunc call site of `object`.
    fn kfunc_insns(object: &[u8]) -> Vec<[u8; 8]> {
        let sites = kfunc_call_sites(object).expect("sites");
        sites
            .iter()
            .map(|&(at, _)| object[at..at + 8].try_into().expect("8 bytes"))
            .collect()
    }

    #[test]
    fn kfunc_calls_become_kfunc_calls_or_no_ops() {
        let object = super::super::loader::bpf_object();
        let before = kfunc_insns(object);
        assert!(!before.is_empty(), "the programs call bpf_preempt_*");
        assert!(before.iter().all(|i| i[0] == BPF_CALL));
        let mut with = features(true);
        with.preempt_kfuncs = Some((1111, 2222));
        let patched = for_kernel(object, &with).expect("patch");
        for insn in kfunc_insns(&patched) {
            assert_eq!((insn[0], insn[1]), (BPF_CALL, BPF_PSEUDO_KFUNC_CALL << 4));
            let id = u32::from_le_bytes(insn[4..8].try_into().expect("4 bytes"));
            assert!(id == 1111 || id == 2222, "{id}");
        }
        let without = for_kernel(object, &features(true)).expect("patch");
        for insn in kfunc_insns(&without) {
            assert_eq!(insn, [BPF_MOV64_IMM, 0, 0, 0, 0, 0, 0, 0]);
        }
        // Nothing else changed.
        assert_eq!(map_types(&without), map_types(object));
    }

    /// How many atomic instructions other than add `object`'s code holds.
    fn atomic_fetches(object: &[u8]) -> usize {
        program_ranges(object)
            .expect("ranges")
            .iter()
            .flat_map(|&(start, end)| object[start..end].chunks_exact(8))
            .filter(|i| matches!(i[0], 0xc3 | 0xdb) && i[4..8] != [0, 0, 0, 0])
            .count()
    }

    #[test]
    fn atomic_fetches_are_dropped_only_where_the_kernel_lacks_them() {
        let object = super::super::loader::bpf_object();
        assert!(
            atomic_fetches(object) > 0,
            "scratch.rs takes slots with fetch-or"
        );
        let mut with = features(true);
        with.atomics = true;
        let kept = for_kernel(object, &with).expect("patch");
        assert_eq!(atomic_fetches(&kept), atomic_fetches(object));
        let dropped = for_kernel(object, &features(true)).expect("patch");
        assert_eq!(atomic_fetches(&dropped), 0);
        assert_eq!(map_types(&dropped), map_types(object));
    }
}
