//! The table alone: files opened by path, no process's maps.

use super::*;

/// Adds `path` to `table` as `identify` does once a file is opened (or
/// not: a path that opens nothing is an unopened object).
fn add(table: &mut ObjectTable, path: &str, maps_id: Option<(u64, u64)>) -> u32 {
    let file = File::open(path).ok();
    let meta = file.as_ref().and_then(|f| f.metadata().ok());
    let key = key_of(meta.as_ref(), path);
    if let Some(i) = table.found(&key, maps_id) {
        return i;
    }
    table.insert(Object {
        key,
        path: path.to_string(),
        maps_id: maps_id.filter(|_| file.is_some()),
        file,
        users: 0,
        referenced: false,
        root: None,
        path_in_root: path.to_string(),
        debug: OnceLock::new(),
    })
}

fn own_exe() -> String {
    std::env::current_exe()
        .expect("own executable")
        .display()
        .to_string()
}

#[test]
fn an_object_goes_when_its_last_user_releases_it_and_its_slot_is_reused() {
    let mut table = ObjectTable::default();
    // Given one file mapped by two processes
    let a = add(&mut table, "/no/such/a.so", None);
    assert_eq!(
        add(&mut table, "/no/such/a.so", None),
        a,
        "one object per file"
    );
    table.retain(a);
    table.retain(a);
    // When one exits, it stays; when the other does, it goes
    table.release(a);
    assert_eq!(table.held(), 1);
    table.release(a);
    assert_eq!(table.held(), 0);
    assert_eq!(table.path(a), None);
    // Then the next file takes its slot
    let b = add(&mut table, "/no/such/b.so", None);
    assert_eq!(b, a);
    assert_eq!(table.path(b), Some("/no/such/b.so"));
    assert_eq!(table.objects.len(), 1);
}

#[test]
fn an_object_an_interned_frame_refers_to_outlives_its_processes() {
    let mut table = ObjectTable::default();
    let exe = own_exe();
    let a = add(&mut table, &exe, None);
    table.retain(a);
    table.reference(a);
    table.release(a);
    // A release more than retains does not underflow or evict
    table.release(a);
    assert_eq!(table.held(), 1);
    assert_eq!(table.path(a), Some(exe.as_str()));
    assert!(table.open_path(a).is_some(), "its file stays open");
    assert!(table.open_file(a).is_some());
}

#[test]
fn an_unopened_object_has_no_file_identity() {
    let mut table = ObjectTable::default();
    let a = add(&mut table, "/no/such/file", Some((1, 2)));
    assert!(table.open_file(a).is_none());
    assert!(table.open_path(a).is_none());
    assert!(table.debug_info(a).is_none());
    assert!(
        table.by_maps_id.is_empty(),
        "only an opened file is found by id"
    );
}

#[test]
fn the_maps_id_names_the_object_until_it_is_evicted() {
    let mut table = ObjectTable::default();
    let exe = own_exe();
    let meta = std::fs::metadata(&exe).expect("own executable");
    // Given the file opened once without the maps' id, then with it
    let a = add(&mut table, &exe, None);
    assert!(table.by_maps_id.is_empty());
    let id = maps_form(&meta);
    assert_eq!(add(&mut table, &exe, Some(id)), a);
    assert_eq!(table.by_maps_id.get(&id), Some(&a));
    assert_eq!(
        table.path_of_file(meta.dev(), meta.ino()),
        Some(exe.as_str())
    );
    // When nothing holds it any more, the id goes with it
    table.retain(a);
    table.release(a);
    assert!(table.by_maps_id.is_empty());
    assert_eq!(table.path_of_file(meta.dev(), meta.ino()), None);
}
