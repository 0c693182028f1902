//! Tables kept after their last process: reused without a rebuild, evicted
//! oldest-unused first when rows run out (never while in use, nor while
//! used within `RECENTLY_USED`), expired after the TTL, and never taken
//! for another file with the same identity.

use super::*;

/// Runs process `pid` mapping file `id` (this binary) at its own address.
fn run(tables: &mut KernelTables, pid: u32, id: FileId) {
    let (a, path) = own_text(0);
    tables.sync(pid, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, |_| {
        Some((id, path.clone()))
    });
}

fn loaded(tables: &KernelTables) -> Vec<FileId> {
    let mut ids: Vec<FileId> = (tables.files.iter())
        .filter(|(_, f)| f.rows.is_some())
        .map(|(&id, _)| id)
        .collect();
    ids.sort_unstable();
    ids
}

#[test]
fn a_kept_table_is_reused_without_a_rebuild() {
    let (shared, mut tables) = fake(1 << 20, 1 << 16);
    run(&mut tables, 1, (1, 1));
    let written = tables.stats.rows_written;
    let first_row = lookup(&shared.0.borrow(), 1, own_text(0).0.start).expect("pid 1");
    tables.drop_process(1);
    assert!(shared.0.borrow().mappings.is_empty());
    run(&mut tables, 2, (1, 1));
    assert_eq!(tables.stats.tables_built, 1, "built once");
    assert_eq!(tables.stats.rows_written, written);
    assert_eq!(tables.stats.reused, 1);
    let again = lookup(&shared.0.borrow(), 2, own_text(0).0.start).expect("pid 2");
    assert_eq!(
        (again.first_row, again.rows),
        (first_row.first_row, first_row.rows)
    );
    assert_eq!(tables.in_use().kept_files, 0, "in use again");
}

#[test]
fn unused_tables_are_evicted_oldest_first_when_rows_run_out_and_tables_in_use_never() {
    let n = own_rows();
    // Room for three tables.
    let (shared, mut tables) = fake(3 * n as usize + 10, 1 << 16);
    let clock = fake_clock(&mut tables);
    run(&mut tables, 1, (1, 1)); // stays in use
    run(&mut tables, 2, (2, 2));
    run(&mut tables, 3, (3, 3));
    tables.drop_process(3); // unused first
    tables.drop_process(2); // unused second
    assert_eq!(loaded(&tables), [(1, 1), (2, 2), (3, 3)]);
    later(&clock, RECENTLY_USED);
    run(&mut tables, 4, (4, 4));
    assert_eq!(tables.stats.evicted, 1);
    assert_eq!(
        loaded(&tables),
        [(1, 1), (2, 2), (4, 4)],
        "(3, 3) went first"
    );
    run(&mut tables, 5, (5, 5));
    assert_eq!(tables.stats.evicted, 2);
    assert_eq!(loaded(&tables), [(1, 1), (4, 4), (5, 5)]);
    // All three in use: a fourth does not fit, and nothing is evicted.
    run(&mut tables, 6, (6, 6));
    assert_eq!(tables.stats.evicted, 2);
    assert_eq!(tables.stats.rows_full, 1);
    assert_eq!(loaded(&tables), [(1, 1), (4, 4), (5, 5)]);
    let v = lookup(&shared.0.borrow(), 6, own_text(0).0.start).expect("pid 6");
    assert_eq!(v.kind, MAPPING_FP_ONLY);
    // The one that did not fit is not built again while it cannot fit
    // (counted again: another process without it) ...
    tables.drop_process(6);
    run(&mut tables, 7, (6, 6));
    assert_eq!(tables.stats.tables_built, 6);
    assert_eq!(tables.stats.rows_full, 2);
    assert_eq!(tables.stats.not_rebuilt, 1);
    // ... nor while the rows are a table used moments ago ...
    tables.drop_process(7);
    tables.drop_process(1);
    run(&mut tables, 8, (6, 6));
    assert_eq!(tables.stats.tables_built, 6);
    assert_eq!(tables.stats.rows_full, 3);
    assert_eq!(tables.stats.kept_out_recent, 1);
    // ... and is once they can be had (pid 1's table unused, evicted).
    tables.drop_process(8);
    later(&clock, RECENTLY_USED);
    run(&mut tables, 9, (6, 6));
    assert_eq!(tables.stats.tables_built, 7);
    assert_eq!(tables.stats.rows_full, 3);
    assert_eq!(loaded(&tables), [(4, 4), (5, 5), (6, 6)]);
    let v = lookup(&shared.0.borrow(), 9, own_text(0).0.start).expect("pid 9");
    assert_eq!(v.kind, MAPPING_TABLE);
}

/// Three programs run in turn, each a short-lived process, every second;
/// the rows hold two of their tables. Evicting the oldest kept table for
/// the next program's would build a table at every run; kept tables used
/// moments ago stay, the third does not fit and, its row count known, is
/// not even built again.
#[test]
fn programs_run_in_turn_whose_tables_exceed_the_rows_do_not_rebuild_at_every_run() {
    let n = own_rows();
    let (shared, mut tables) = fake(2 * n as usize + 10, 1 << 16);
    let clock = fake_clock(&mut tables);
    let files = [(1, 1), (2, 2), (3, 3)];
    let rounds = 10;
    let mut pid = 0;
    for _ in 0..rounds {
        for id in files {
            pid += 1;
            run(&mut tables, pid, id);
            let kind = lookup(&shared.0.borrow(), pid, own_text(0).0.start).map(|v| v.kind);
            let want = if id == (3, 3) {
                MAPPING_FP_ONLY
            } else {
                MAPPING_TABLE
            };
            assert_eq!(kind, Some(want), "pid {pid} mapping {id:?}");
            tables.drop_process(pid);
            later(&clock, Duration::from_secs(1));
        }
    }
    let t = tables.stats;
    assert_eq!(t.tables_built, 3, "each file built once");
    assert_eq!(t.evicted, 0);
    assert_eq!(t.reused, 2 * (rounds - 1));
    // Every run of the third program is counted, none silently.
    assert_eq!(t.rows_full, rounds);
    assert_eq!(t.kept_out_recent, rounds);
    assert_eq!(t.not_rebuilt, rounds - 1);
    assert_eq!(loaded(&tables), [(1, 1), (2, 2)]);
}

/// The same programs run a window apart: a kept table unused for
/// RECENTLY_USED gives way to the newcomer as before (built at each run:
/// the rows hold one), and the one it evicted, its row count known, waits
/// without a build while the newcomer's table is recent.
#[test]
fn a_kept_table_unused_longer_than_the_window_is_evicted_for_a_newcomer() {
    let n = own_rows();
    let (shared, mut tables) = fake(n as usize + n as usize / 2, 1 << 16);
    let clock = fake_clock(&mut tables);
    run(&mut tables, 1, (1, 1));
    tables.drop_process(1);
    later(&clock, RECENTLY_USED + Duration::from_secs(1));
    run(&mut tables, 2, (2, 2));
    assert_eq!(loaded(&tables), [(2, 2)]);
    assert_eq!((tables.stats.evicted, tables.stats.tables_built), (1, 2));
    assert_eq!(tables.stats.rows_full, 0);
    tables.drop_process(2);
    later(&clock, Duration::from_secs(1));
    run(&mut tables, 3, (1, 1));
    assert_eq!(
        tables.stats.tables_built, 2,
        "evicted, then not built again"
    );
    assert_eq!((tables.stats.rows_full, tables.stats.not_rebuilt), (1, 1));
    assert_eq!(tables.stats.kept_out_recent, 1);
    let v = lookup(&shared.0.borrow(), 3, own_text(0).0.start).expect("pid 3");
    assert_eq!(v.kind, MAPPING_FP_ONLY);
    tables.drop_process(3);
    later(&clock, RECENTLY_USED);
    run(&mut tables, 4, (1, 1));
    assert_eq!(loaded(&tables), [(1, 1)]);
    assert_eq!((tables.stats.evicted, tables.stats.tables_built), (2, 3));
}

/// However long a table has been in use, it is not evicted: a newcomer
/// that needs its rows does not fit (and is not counted as kept out by
/// the window: no unused table could have made room).
#[test]
fn a_table_in_use_is_never_evicted_however_old() {
    let n = own_rows();
    let (shared, mut tables) = fake(n as usize + n as usize / 2, 1 << 16);
    let clock = fake_clock(&mut tables);
    run(&mut tables, 1, (1, 1));
    later(&clock, UNUSED_TABLE_TTL * 2);
    tables.expire_unused(clock.get());
    run(&mut tables, 2, (2, 2));
    assert_eq!(loaded(&tables), [(1, 1)]);
    assert_eq!((tables.stats.evicted, tables.stats.expired), (0, 0));
    assert_eq!(
        (tables.stats.rows_full, tables.stats.kept_out_recent),
        (1, 0)
    );
    let v = lookup(&shared.0.borrow(), 1, own_text(0).0.start).expect("pid 1");
    assert_eq!(v.kind, MAPPING_TABLE);
}

/// A process that started while the rows were held by tables used moments
/// ago gets its table once they are not: `waiting` names it (and every
/// process using the file) and describing it again loads the table.
#[test]
fn a_process_kept_out_by_recent_tables_gets_its_table_once_the_window_passes() {
    let n = own_rows();
    let (shared, mut tables) = fake(n as usize + n as usize / 2, 1 << 16);
    let clock = fake_clock(&mut tables);
    run(&mut tables, 1, (1, 1));
    tables.drop_process(1);
    run(&mut tables, 2, (2, 2)); // long-lived
    run(&mut tables, 3, (2, 2)); // the same program again
    assert_eq!(tables.stats.rows_full, 2);
    assert!(tables.waiting(clock.get()).is_empty(), "the window holds");
    later(&clock, RECENTLY_USED);
    assert_eq!(tables.waiting(clock.get()), [2, 3]);
    let built = tables.stats.tables_built;
    for pid in [2, 3] {
        run(&mut tables, pid, (2, 2));
        let v = lookup(&shared.0.borrow(), pid, own_text(0).0.start).expect("described");
        assert_eq!(v.kind, MAPPING_TABLE, "pid {pid}");
    }
    assert_eq!(tables.stats.tables_built, built + 1);
    assert_eq!(loaded(&tables), [(2, 2)]);
    assert_eq!(tables.stats.loaded_late, 1);
    assert_eq!(tables.stats.rows_full, 2, "not counted again");
    assert!(tables.waiting(clock.get()).is_empty());
}

/// A table needs one extent: unused tables on both sides of one in use
/// are not room for a table as large as both.
#[test]
fn room_is_one_extent_not_the_sum_of_scattered_rows() {
    let n = own_rows();
    let (_, mut tables) = fake(3 * n as usize, 1 << 16);
    let clock = fake_clock(&mut tables);
    run(&mut tables, 1, (1, 1));
    run(&mut tables, 2, (2, 2)); // stays in use, in the middle
    run(&mut tables, 3, (3, 3));
    tables.drop_process(1);
    tables.drop_process(3);
    later(&clock, RECENTLY_USED);
    let now = clock.get();
    assert!(tables.could_fit(n, now, Evictable::Idle));
    assert!(!tables.could_fit(n + 1, now, Evictable::Idle));
    tables.drop_process(2);
    assert!(
        !tables.could_fit(3 * n, now, Evictable::Idle),
        "2 is recent"
    );
    assert!(tables.could_fit(3 * n, now, Evictable::AnyUnused));
}

#[test]
fn unused_tables_expire_after_the_ttl_and_tables_in_use_do_not() {
    let (shared, mut tables) = fake(1 << 20, 1 << 16);
    run(&mut tables, 1, (1, 1));
    run(&mut tables, 2, (2, 2));
    tables.drop_process(2);
    let released = Instant::now();
    tables.expire_unused(released + UNUSED_TABLE_TTL - Duration::from_secs(1));
    assert_eq!(loaded(&tables), [(1, 1), (2, 2)], "not yet");
    tables.expire_unused(released + UNUSED_TABLE_TTL + Duration::from_secs(1));
    assert_eq!(loaded(&tables), [(1, 1)]);
    assert_eq!(tables.stats.expired, 1);
    tables.drop_process(1);
    tables.expire_unused(Instant::now() + UNUSED_TABLE_TTL);
    assert_eq!(tables.held(), (0, 0));
    assert_eq!((tables.stats.files, tables.stats.rows_used), (0, 0));
    assert!(shared.0.borrow().mappings.is_empty());
}

/// A deleted file's inode number can come back as another file: a kept
/// table is not taken for a file that is not the one it was built from.
#[test]
fn a_kept_table_is_not_reused_for_another_file_with_the_same_identity() {
    let (_, mut tables) = fake(1 << 20, 1 << 16);
    run(&mut tables, 1, (1, 1));
    tables.drop_process(1);
    let (a, _) = own_text(0);
    let other = PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6");
    tables.sync(2, std::slice::from_ref(&a), &[0], &JitCode::EMPTY, |_| {
        Some(((1, 1), other.clone()))
    });
    assert_eq!(tables.stats.tables_built, 2, "built again");
    assert_eq!(tables.stats.reused, 0);
    assert_eq!(tables.held(), (1, 1));
}
