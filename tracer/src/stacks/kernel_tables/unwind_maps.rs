//! The manager's view of the BPF maps it fills: UNWIND_ROWS's rows and
//! UNWIND_MAPPINGS's trie entries (`bpf.rs` on the real maps).

use tracer_common::{MappingKey, MappingValue};

/// What the manager needs of the BPF maps (a fake in the tests).
pub trait UnwindMaps {
    /// Rows UNWIND_ROWS holds.
    fn rows_capacity(&self) -> u32;
    fn write_rows(&mut self, first: u32, rows: &[u64]) -> anyhow::Result<()>;
    fn insert_mapping(&mut self, key: PrefixKey, value: MappingValue) -> anyhow::Result<()>;
    fn remove_mapping(&mut self, key: PrefixKey) -> anyhow::Result<()>;
    /// After a sync's or a drop's inserts and removes: the walkers' rule
    /// caches are told once, not once per entry.
    fn changed(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// An UNWIND_MAPPINGS key with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    pub prefix_len: u32,
    pub key: MappingKey,
}
