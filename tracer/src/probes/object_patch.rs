//! The BPF object as the running kernel can load it. Where the kernel has
//! no task-local storage (before 5.11), INFLIGHT, a task storage map, is
//! defined as a hash map instead (its key, a u32, is then the thread id,
//! and tracer-ebpf's INFLIGHT_BY_TID global switches its programs over):
//! a BTF map's type is the element count of the array its `type` member
//! points to, rewritten in place in the object's .BTF section. aya creates
//! every map of an object, so a map the kernel cannot create fails the
//! whole load otherwise.

use std::borrow::Cow;

use anyhow::Context as _;
use object::{Object as _, ObjectSection as _};

use super::{kernel_btf::Btf, kernel_features::KernelFeatures};

const BPF_MAP_TYPE_HASH: u32 = 1;
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

/// `object`, with INFLIGHT made a hash map where `features` lack task
/// storage.
pub fn for_kernel<'a>(
    object: &'a [u8],
    features: &KernelFeatures,
) -> anyhow::Result<Cow<'a, [u8]>> {
    if features.task_storage {
        return Ok(Cow::Borrowed(object));
    }
    let at = map_type_at(object, "INFLIGHT")?;
    let mut patched = object.to_vec();
    let word = patched
        .get_mut(at..at + 4)
        .context("INFLIGHT's map type lies outside the object")?;
    let old = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
    anyhow::ensure!(
        old == BPF_MAP_TYPE_TASK_STORAGE,
        "INFLIGHT is defined with map type {old}, not task storage"
    );
    word.copy_from_slice(&BPF_MAP_TYPE_HASH.to_le_bytes());
    Ok(Cow::Owned(patched))
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
            if name == "INFLIGHT" {
                assert_eq!((*old, *new), (BPF_MAP_TYPE_TASK_STORAGE, BPF_MAP_TYPE_HASH));
            } else {
                assert_eq!(old, new, "{name}");
            }
        }
        assert!(before.iter().any(|(n, _)| n == "INFLIGHT"));
    }

    #[test]
    fn with_task_storage_the_object_is_as_built() {
        let object = super::super::loader::bpf_object();
        assert!(matches!(
            for_kernel(object, &features(true)).expect("patch"),
            Cow::Borrowed(_)
        ));
    }
}
