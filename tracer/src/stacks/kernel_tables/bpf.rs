//! `UnwindMaps` on the real BPF maps: UNWIND_ROWS is memory-mapped
//! (BPF_F_MMAPABLE), so a table is written with one copy instead of a
//! syscall per row; UNWIND_MAPPINGS is an aya LPM trie. Every batch of
//! changes to the trie (one process's sync or drop) bumps STATE_UNWIND_GEN
//! afterwards, which empties the walkers' per-CPU rule caches (tracer-ebpf
//! walk.rs RULE_CACHE).

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::Context as _;
use aya::maps::{
    lpm_trie::{Key, LpmTrie},
    Array, IterableMap as _, MapData,
};
use tracer_common::{MappingKey, MappingValue};

use super::unwind_maps::{PrefixKey, UnwindMaps};

pub struct BpfUnwindMaps {
    /// Kept so the mapping stays valid (the map lives while its fd does).
    _rows_map: Array<MapData, u64>,
    rows: *mut u64,
    capacity: u32,
    mappings: LpmTrie<MapData, MappingKey, MappingValue>,
    /// The BPF STATE array, and the last generation written to it.
    state: Array<MapData, u64>,
    gen: u64,
}

impl BpfUnwindMaps {
    pub fn new(
        rows_map: Array<MapData, u64>,
        mappings: LpmTrie<MapData, MappingKey, MappingValue>,
        state: Array<MapData, u64>,
    ) -> anyhow::Result<BpfUnwindMaps> {
        let capacity = rows_map.len();
        let fd = rows_map.map().fd().as_fd().as_raw_fd();
        // SAFETY: maps the array's value area (BPF_F_MMAPABLE) shared with
        // the kernel; the length is the map's, checked by the kernel.
        let rows = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity as usize * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if rows == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()).context("memory-mapping UNWIND_ROWS");
        }
        Ok(BpfUnwindMaps {
            _rows_map: rows_map,
            rows: rows.cast(),
            capacity,
            mappings,
            state,
            gen: 0,
        })
    }

    /// After trie changes: cached rules from before them no longer count.
    /// Bumped after the last change, so that a walk that read the trie
    /// before or between them filled its cache under a generation that is
    /// now stale. (Once per batch, not per entry: the walk of a process
    /// whose maps change already runs its new code before the tracer reads
    /// them, so a batch's microseconds add nothing that per-entry bumps
    /// prevented.)
    fn bump_generation(&mut self) -> anyhow::Result<()> {
        self.gen += 1;
        self.state
            .set(tracer_common::STATE_UNWIND_GEN, self.gen, 0)
            .context("bumping the unwind-rule caches' generation")?;
        Ok(())
    }
}

impl Drop for BpfUnwindMaps {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, of that length, unmapped once.
        unsafe { libc::munmap(self.rows.cast(), self.capacity as usize * 8) };
    }
}

impl UnwindMaps for BpfUnwindMaps {
    fn rows_capacity(&self) -> u32 {
        self.capacity
    }

    fn write_rows(&mut self, first: u32, rows: &[u64]) -> anyhow::Result<()> {
        let end = first as usize + rows.len();
        anyhow::ensure!(end <= self.capacity as usize, "rows past the map's end");
        // SAFETY: [first, end) is inside the mapping (checked above); the
        // walker reads rows only once their mapping entries exist, which
        // are inserted after this copy.
        unsafe {
            std::ptr::copy_nonoverlapping(rows.as_ptr(), self.rows.add(first as usize), rows.len())
        };
        Ok(())
    }

    fn insert_mapping(&mut self, key: PrefixKey, value: MappingValue) -> anyhow::Result<()> {
        self.mappings
            .insert(&Key::new(key.prefix_len, key.key), value, 0)?;
        Ok(())
    }

    fn remove_mapping(&mut self, key: PrefixKey) -> anyhow::Result<()> {
        self.mappings.remove(&Key::new(key.prefix_len, key.key))?;
        Ok(())
    }

    fn changed(&mut self) -> anyhow::Result<()> {
        self.bump_generation()
    }
}
