//! Merges of maps read one after another, with objects named by path.

use super::*;

fn file(path: &str, start: u64, end: u64, offset: u64, executable: bool) -> Mapping {
    Mapping {
        start,
        end,
        offset,
        executable,
        path: path.to_string(),
        dev_inode: (0, 0),
    }
}

fn lib(path: &str, start: u64, end: u64, offset: u64) -> Mapping {
    file(path, start, end, offset, true)
}

/// Merges `new` with objects numbered by path (one per distinct path),
/// and counts the calls to `identify`.
struct Paths {
    ids: Vec<String>,
    calls: usize,
}

impl Paths {
    fn new() -> Paths {
        Paths {
            ids: Vec::new(),
            calls: 0,
        }
    }

    fn merge(&mut self, maps: &mut ProcessMaps, new: Vec<Mapping>) -> Merged {
        maps.merge(new, |m| {
            self.calls += 1;
            match self.ids.iter().position(|p| *p == m.path) {
                Some(i) => i as u32,
                None => {
                    self.ids.push(m.path.clone());
                    (self.ids.len() - 1) as u32
                }
            }
        })
    }
}

#[test]
fn known_mappings_stay_unless_a_new_one_overlaps_them() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    let a = lib("/lib/a.so", 0x1000, 0x3000, 0);
    paths.merge(&mut maps, vec![a.clone()]);
    // A read that no longer shows a.so (its events may be in flight) and
    // shows b.so elsewhere keeps both, sorted
    let b = lib("/lib/b.so", 0x0800, 0x0900, 0);
    let merged = paths.merge(&mut maps, vec![b.clone()]);
    assert_eq!(maps.maps(), [b.clone(), a.clone()]);
    assert_eq!(maps.objects(), [1, 0]);
    assert_eq!(merged.released, [0], "the objects before, to release");
    assert!(merged.changed && merged.maps_changed && merged.code_changed);
    // A mapping over a.so's range replaces it
    let c = lib("/lib/c.so", 0x2000, 0x4000, 0);
    paths.merge(&mut maps, vec![c.clone()]);
    assert_eq!(maps.maps(), [b, c]);
    assert_eq!(
        maps.find(0x2100).map(|(m, o)| (m.start, o)),
        Some((0x2000, 2))
    );
    assert_eq!(maps.find(0x1000), None);
}

#[test]
fn an_unchanged_mapping_keeps_its_object_and_a_path_is_identified_once() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    let text = lib("/lib/a.so", 0x1000, 0x2000, 0);
    let data = file("/lib/a.so", 0x2000, 0x3000, 0x1000, false);
    paths.merge(&mut maps, vec![text.clone(), data.clone()]);
    assert_eq!(paths.calls, 1, "one path, one identify");
    let merged = paths.merge(&mut maps, vec![text, data]);
    assert_eq!(paths.calls, 1, "nothing identified again");
    assert!(!merged.changed && !merged.maps_changed && !merged.code_changed);
    assert_eq!(merged.released, [0, 0]);
}

/// Other code at an address range known before (a library unloaded and
/// another loaded in its place) counts as a remap; a new range, or the
/// same file split at the same place (mprotect), does not.
#[test]
fn another_file_at_known_addresses_is_a_remap_and_a_new_range_is_not() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    let a = lib("/plugins/a.so", 0x7f00_0000_1000, 0x7f00_0000_3000, 0x1000);
    assert!(!paths.merge(&mut maps, vec![a]).remapped);
    // The same file split in two at the same place, and a new library.
    let split = vec![
        lib("/plugins/a.so", 0x7f00_0000_1000, 0x7f00_0000_2000, 0x1000),
        lib("/plugins/a.so", 0x7f00_0000_2000, 0x7f00_0000_3000, 0x2000),
        lib("/plugins/c.so", 0x7f00_1000_0000, 0x7f00_1000_2000, 0),
    ];
    assert!(!paths.merge(&mut maps, split.clone()).remapped);
    // b.so where a.so was.
    let mut b = split;
    b[0] = lib("/plugins/b.so", 0x7f00_0000_1000, 0x7f00_0000_3000, 0x1000);
    b.remove(1);
    assert!(paths.merge(&mut maps, b.clone()).remapped);
    assert_eq!(maps.maps()[0].path, "/plugins/b.so");
    // Read again unchanged: no further remap.
    assert!(!paths.merge(&mut maps, b).remapped);
}

/// A data file mapped where another was (an mmap'ed database, a locale
/// file) holds no code: no interned address changed meaning.
#[test]
fn another_data_file_at_known_addresses_is_no_remap() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    let at = |path: &str, executable: bool| {
        file(path, 0x7f00_0000_1000, 0x7f00_0000_3000, 0, executable)
    };
    let mut remaps = 0;
    let mut read = |maps: &mut ProcessMaps, m: Mapping| {
        remaps += u32::from(paths.merge(maps, vec![m]).remapped);
        remaps
    };
    // Given a data file at an address, then another in its place
    read(&mut maps, at("/data/a.db", false));
    // Then no remap
    assert_eq!(read(&mut maps, at("/data/b.db", false)), 0);
    // Code where data was, or data where code was: none either
    read(&mut maps, at("/lib/a.so", true));
    assert_eq!(read(&mut maps, at("/data/c.db", false)), 0);
    // Code where code was: a remap
    read(&mut maps, at("/lib/a.so", true));
    assert_eq!(read(&mut maps, at("/lib/b.so", true)), 1);
}

/// Data files mapped or unmapped change the maps, not the code (where
/// kernel walks ended is kept then).
#[test]
fn data_mapped_or_unmapped_is_no_code_change() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    let a = lib("/lib/a.so", 0x7f00_0000_1000, 0x7f00_0000_3000, 0);
    let db = |path: &str| file(path, 0x7f00_1000_0000, 0x7f00_1000_2000, 0, false);
    paths.merge(&mut maps, vec![a.clone()]);
    let merged = paths.merge(&mut maps, vec![a.clone(), db("/data/a.db")]);
    assert!(merged.changed && !merged.code_changed);
    let merged = paths.merge(&mut maps, vec![a.clone(), db("/data/b.db")]);
    assert!(merged.changed && !merged.code_changed);
    // Another library where the first was is
    let b = lib("/lib/b.so", a.start, a.end, 0);
    assert!(paths.merge(&mut maps, vec![b]).code_changed);
}

#[test]
fn clearing_hands_back_the_objects() {
    let (mut maps, mut paths) = (ProcessMaps::default(), Paths::new());
    paths.merge(&mut maps, vec![lib("/lib/a.so", 0x1000, 0x2000, 0)]);
    assert_eq!(maps.clear(), [0]);
    assert!(maps.is_empty() && maps.objects().is_empty());
}
