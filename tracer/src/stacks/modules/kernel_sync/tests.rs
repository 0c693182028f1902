//! The sync against a fake of the BPF maps too small for any table.

use super::*;
use crate::{
    stacks::kernel_tables::{PrefixKey, UnwindMaps},
    tracee::process::Mapping,
};
use tracer_common::MappingValue;

/// BPF maps with `rows` rows that take every mapping.
struct Tiny {
    rows: u32,
}

impl UnwindMaps for Tiny {
    fn rows_capacity(&self) -> u32 {
        self.rows
    }
    fn write_rows(&mut self, _: u32, _: &[u64]) -> anyhow::Result<()> {
        Ok(())
    }
    fn insert_mapping(&mut self, _: PrefixKey, _: MappingValue) -> anyhow::Result<()> {
        Ok(())
    }
    fn remove_mapping(&mut self, _: PrefixKey) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A pid that no process has: files are opened by their path.
const NO_SUCH_PID: u32 = 1 << 23;

/// This test binary's executable mapping, as its maps show it.
fn own_text() -> Mapping {
    let text = std::fs::read("/proc/self/maps").expect("own maps");
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    crate::tracee::process::parse_maps(&text)
        .into_iter()
        .find(|m| m.executable && Path::new(&m.path) == exe)
        .expect("an executable mapping of the test binary")
}

#[test]
fn the_largest_file_whose_table_did_not_fit_is_named_by_its_path() {
    let mut sync = KernelSync::new(Some(KernelTables::new(Box::new(Tiny { rows: 16 }))));
    let mut objects = ObjectTable::default();
    let mut maps = ProcessMaps::default();
    let text = Mapping {
        dev_inode: (0, 0),
        ..own_text()
    };
    maps.merge(vec![text.clone()], |m| objects.identify(NO_SUCH_PID, m));
    sync.describe(NO_SUCH_PID, &maps, &JitCode::EMPTY, &objects);
    let (name, rows) = sync.largest_unfit_table().expect("a table too large");
    assert_eq!(name, text.path);
    assert!(rows > 16);
    // Gone with the process from the tables, kept for --verbose
    sync.drop_process(NO_SUCH_PID);
    assert_eq!(
        sync.in_use().map(|u| (u.mappings, u.processes)),
        Some((0, 0))
    );
    assert!(sync.largest_unfit_table().is_some());
}

#[test]
fn without_tables_nothing_is_described() {
    let mut sync = KernelSync::new(None);
    let (objects, maps) = (ObjectTable::default(), ProcessMaps::default());
    sync.describe(1, &maps, &JitCode::EMPTY, &objects);
    assert!(sync.tables().is_none() && sync.in_use().is_none());
    assert!(sync.tick(Instant::now()).is_empty());
}
