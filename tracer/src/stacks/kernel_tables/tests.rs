//! The map-filling logic against a fake of the BPF maps: tables shared by
//! file, kept after their last process and reused, evicted oldest-unused
//! first for rows and after a TTL, what does not fit counted.

use std::{
    cell::{Cell, RefCell},
    collections::HashMap,
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

use tracer_common::{MappingKey, MappingValue, MAPPING_FP_ONLY, MAPPING_TABLE};

use super::{
    extents::Extents, kept::Evictable, prefixes, FileId, KernelTables, PrefixKey, UnwindMaps,
    RECENTLY_USED, UNUSED_TABLE_TTL,
};
use crate::{stacks::trampolines::JitCode, tracee::process::Mapping};

mod kept;

#[derive(Default)]
pub(super) struct Fake {
    pub(super) rows: Vec<u64>,
    pub(super) mappings: HashMap<PrefixKey, MappingValue>,
    max_mappings: usize,
}

#[derive(Clone)]
pub(super) struct Shared(pub(super) Rc<RefCell<Fake>>);

impl UnwindMaps for Shared {
    fn rows_capacity(&self) -> u32 {
        self.0.borrow().rows.len() as u32
    }
    fn write_rows(&mut self, first: u32, rows: &[u64]) -> anyhow::Result<()> {
        let mut f = self.0.borrow_mut();
        f.rows[first as usize..first as usize + rows.len()].copy_from_slice(rows);
        Ok(())
    }
    fn insert_mapping(&mut self, key: PrefixKey, value: MappingValue) -> anyhow::Result<()> {
        let mut f = self.0.borrow_mut();
        anyhow::ensure!(
            f.mappings.len() < f.max_mappings || f.mappings.contains_key(&key),
            "full"
        );
        f.mappings.insert(key, value);
        Ok(())
    }
    fn remove_mapping(&mut self, key: PrefixKey) -> anyhow::Result<()> {
        self.0.borrow_mut().mappings.remove(&key);
        Ok(())
    }
}

pub(super) fn fake(rows: usize, max_mappings: usize) -> (Shared, KernelTables) {
    let shared = Shared(Rc::new(RefCell::new(Fake {
        rows: vec![0; rows],
        mappings: HashMap::new(),
        max_mappings,
    })));
    let tables = KernelTables::new(Box::new(shared.clone()));
    (shared, tables)
}

/// Makes `tables` read the time from the returned cell, which the test
/// moves on with `later`.
fn fake_clock(tables: &mut KernelTables) -> Rc<Cell<Instant>> {
    let now = Rc::new(Cell::new(Instant::now()));
    let read = Rc::clone(&now);
    tables.clock = Box::new(move || read.get());
    now
}

fn later(clock: &Cell<Instant>, by: Duration) {
    clock.set(clock.get() + by);
}

/// This test binary's executable mapping, at `shift` from where it is.
fn own_text(shift: u64) -> (Mapping, PathBuf) {
    let text = std::fs::read("/proc/self/maps").expect("own maps");
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    let mut m = crate::tracee::process::parse_maps(&text)
        .into_iter()
        .find(|m| m.executable && std::path::Path::new(&m.path) == exe)
        .expect("an executable mapping of the test binary");
    m.start += shift;
    m.end += shift;
    (m, exe)
}

/// Rows of this test binary's table (each test's tables are this file
/// under several identities).
fn own_rows() -> u32 {
    let (_, path) = own_text(0);
    let file = std::fs::File::open(path).expect("own exe");
    let table = super::UnwindTable::from_file(&file).1.expect("table");
    table.encoded().expect("fits").len() as u32
}

/// The walker's lookup: the longest prefix covering (pid, addr).
pub(super) fn lookup(f: &Fake, pid: u32, addr: u64) -> Option<MappingValue> {
    (0..=96u32).rev().find_map(|len| {
        let mut bits = u128::from(pid) << 64 | u128::from(addr);
        bits &= !0u128 << (96 - len) & ((1u128 << 96) - 1);
        let key = MappingKey::new((bits >> 64) as u32, bits as u64);
        f.mappings
            .get(&PrefixKey {
                prefix_len: len,
                key,
            })
            .copied()
    })
}

#[test]
fn prefixes_cover_a_range_exactly_with_aligned_blocks() {
    for (start, end) in [
        (0x1000, 0x2000),
        (0x7f00_1000, 0x7f3a_5000),
        (0x5000, 0x6_3000),
    ] {
        let keys = prefixes(7, start, end);
        let mut at = start;
        for k in &keys {
            let size = 1u64 << (96 - k.prefix_len);
            assert_eq!(k.key, MappingKey::new(7, at));
            assert_eq!(at % size, 0, "aligned block");
            at += size;
        }
        assert_eq!(at, end);
        assert!(keys.len() <= 2 * 64);
    }
}

#[test]
fn a_file_mapped_by_two_processes_is_loaded_once_and_kept_after_the_last() {
    let (shared, mut tables) = fake(1 << 20, 1 << 16);
    let (a, path) = own_text(0);
    let (b, _) = own_text(0x1000_0000);
    let open = |_| Some(((1, 1), path.clone()));
    tables.sync(1, std::slice::from_ref(&a), &[5], &JitCode::EMPTY, open);
    let rows = tables.stats.rows_used;
    assert!(rows > 100, "the test binary has CFI: {rows} rows");
    tables.sync(2, std::slice::from_ref(&b), &[5], &JitCode::EMPTY, open);
    assert_eq!(tables.stats.rows_used, rows, "shared, not loaded twice");
    assert_eq!(tables.stats.files, 1);
    {
        let f = shared.0.borrow();
        let va = lookup(&f, 1, a.start + 0x10).expect("pid 1 described");
        let vb = lookup(&f, 2, b.start + 0x10).expect("pid 2 described");
        assert_eq!(va.kind, MAPPING_TABLE);
        assert_eq!((va.first_row, va.rows), (vb.first_row, vb.rows));
        assert_eq!(vb.load_base - va.load_base, 0x1000_0000, "per-process bias");
        assert!(lookup(&f, 1, a.end).is_none());
        assert!(lookup(&f, 3, a.start).is_none());
        // The rows are sorted by address, as the walker's search needs.
        let t = &f.rows[va.first_row as usize..(va.first_row + va.rows) as usize];
        assert!(t.windows(2).all(|w| w[0] >> 32 < w[1] >> 32));
    }
    tables.drop_process(1);
    assert_eq!(tables.stats.files, 1, "pid 2 still maps it");
    tables.drop_process(2);
    assert!(shared.0.borrow().mappings.is_empty());
    assert_eq!(tables.held(), (1, 0), "the table kept, no process");
    let kept = tables.in_use();
    assert_eq!((kept.files, kept.kept_files), (1, 1));
    assert_eq!((kept.rows, kept.kept_rows), (rows, rows));
    assert_eq!(kept.mappings, 0);
}

#[test]
fn a_table_too_large_for_the_rows_is_counted_and_its_frames_use_frame_pointers() {
    let (shared, mut tables) = fake(16, 1 << 16);
    let (a, path) = own_text(0);
    tables.sync(1, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, |_| {
        Some(((1, 1), path.clone()))
    });
    assert_eq!(tables.stats.rows_full, 1);
    let v = lookup(&shared.0.borrow(), 1, a.start).expect("described anyway");
    assert_eq!(v.kind, MAPPING_FP_ONLY);
    // --verbose names it, with the rows it needs.
    assert_eq!(tables.largest_unfit(), Some(((1, 1), own_rows())));
}

#[test]
fn mappings_the_trie_has_no_room_for_are_counted() {
    let (_, mut tables) = fake(1 << 20, 1);
    let (a, path) = own_text(0x1234_5000);
    tables.sync(1, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, |_| {
        Some(((1, 1), path.clone()))
    });
    assert!(tables.stats.mappings_full > 0);
}

#[test]
fn a_resync_changes_only_what_changed_and_exec_drops_everything() {
    let (shared, mut tables) = fake(1 << 20, 1 << 16);
    let (a, path) = own_text(0);
    let open = |_| Some(((1, 1), path.clone()));
    tables.sync(1, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, open);
    let before = shared.0.borrow().mappings.len();
    tables.sync(1, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, open);
    assert_eq!(shared.0.borrow().mappings.len(), before);
    assert_eq!(
        tables.stats.rows_written, tables.stats.rows_used,
        "not rebuilt"
    );
    // A file that cannot be read: described as frame-pointer only.
    let (b, _) = own_text(0x4000_0000);
    let missing = std::path::PathBuf::from("/nonexistent/file");
    tables.sync(1, &[a.clone(), b.clone()], &[0, 1], &JitCode::EMPTY, |o| {
        Some(if o == 0 {
            ((1, 1), path.clone())
        } else {
            ((2, 2), missing.clone())
        })
    });
    assert_eq!(tables.stats.table_errors, 1);
    let v = lookup(&shared.0.borrow(), 1, b.start).expect("described");
    assert_eq!(v.kind, MAPPING_FP_ONLY);
    tables.drop_process(1);
    assert!(shared.0.borrow().mappings.is_empty());
    assert_eq!(tables.held(), (1, 0), "the unreadable file's entry went");
}

#[test]
fn a_prepared_table_is_built_once_kept_until_used_and_kept_after() {
    let (_, mut tables) = fake(1 << 20, 1 << 16);
    let (a, path) = own_text(0);
    let meta = std::fs::metadata(&path).expect("own exe");
    let id = (
        std::os::unix::fs::MetadataExt::dev(&meta),
        std::os::unix::fs::MetadataExt::ino(&meta),
    );
    tables.prepare(&path);
    assert_eq!(tables.stats.files, 1);
    tables.sync(9, &[], &[], &JitCode::EMPTY, |_| None);
    assert_eq!(tables.stats.files, 1, "kept while unused");
    tables.sync(1, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, |_| {
        Some((id, path.clone()))
    });
    assert_eq!(
        tables.stats.rows_written, tables.stats.rows_used,
        "not built again"
    );
    tables.drop_process(1);
    assert_eq!(tables.stats.files, 1);
    tables.expire_unused(Instant::now() + UNUSED_TABLE_TTL);
    assert_eq!(tables.stats.files, 0);
}

#[test]
fn extents_are_first_fit_and_merge_when_freed() {
    let mut e = Extents::new(100);
    let a = e.alloc(30).expect("a");
    let b = e.alloc(30).expect("b");
    let c = e.alloc(30).expect("c");
    assert_eq!((a, b, c), (0, 30, 60));
    assert_eq!(e.alloc(20), None);
    e.release(b, 30);
    assert_eq!(e.alloc(20), Some(30));
    e.release(30, 20);
    e.release(a, 30);
    e.release(c, 30);
    assert_eq!(e.largest(), 100);
}
