//! Trampoline spans described to the walker with their shape's table,
//! against the fake BPF maps of `kernel_tables/tests.rs`.

use tracer_common::{MAPPING_FP_ONLY, MAPPING_TABLE};

use super::super::tests::{fake, lookup};
use crate::stacks::{
    trampolines::{JitCode, Shape, TrampolineSpan},
    unwind_table::{decode_rule, Cfa},
};

const BASE: u64 = 0x7f00_0000_0000;
const PLAIN: Shape = Shape {
    endbr: false,
    stride: 11,
};

/// A range of three arenas: trampolines, other JIT code, trampolines.
fn python_jit() -> JitCode {
    let span = |from: u64, to: u64| TrampolineSpan {
        range: BASE + from..BASE + to,
        shape: PLAIN,
    };
    let range = BASE..BASE + 0x30000;
    JitCode::with(vec![range], vec![span(0, 0x10000), span(0x20000, 0x30000)])
}

#[test]
fn trampoline_spans_get_their_shape_s_rows_and_the_rest_frame_pointers() {
    let (shared, mut tables) = fake(1 << 16, 1 << 16);
    tables.sync(1, &[], &[], &python_jit(), |_| None);
    let rows = PLAIN.table().rows.len() as u64;
    assert_eq!(tables.stats.rows_used, rows, "one table for both spans");
    assert_eq!(tables.stats.trampoline_tables, 1);
    let f = shared.0.borrow();
    for start in [BASE, BASE + 0x20000] {
        for at in [start, start + 5, start + 0xfff0] {
            let v = lookup(&f, 1, at).expect("described");
            assert_eq!(v.kind, MAPPING_TABLE);
            assert_eq!(v.load_base, start, "rows are relative to the span");
            assert_eq!(u64::from(v.rows), rows);
            // The walker's binary search over the rows written, at the
            // call's return address - 1 of the 100th copy: RSP + 16.
            let table = &f.rows[v.first_row as usize..(v.first_row + v.rows) as usize];
            let rel = 11 * 100 + 5;
            let row = table
                .iter()
                .rev()
                .find(|r| (*r >> 32) <= rel)
                .expect("a row");
            assert_eq!(decode_rule(*row as u32).map(|r| r.cfa), Some(Cfa::Sp(16)));
        }
    }
    let between = lookup(&f, 1, BASE + 0x18000).expect("described");
    assert_eq!(between.kind, MAPPING_FP_ONLY);
}

#[test]
fn a_shape_s_table_is_shared_and_freed_with_its_last_process() {
    let (_shared, mut tables) = fake(1 << 16, 1 << 16);
    tables.sync(1, &[], &[], &python_jit(), |_| None);
    tables.sync(2, &[], &[], &python_jit(), |_| None);
    // A third read of the same maps changes nothing.
    tables.sync(2, &[], &[], &python_jit(), |_| None);
    let rows = PLAIN.table().rows.len() as u64;
    assert_eq!(tables.stats.rows_used, rows);
    assert_eq!(tables.stats.rows_written, rows, "built once");
    tables.drop_process(1);
    assert_eq!(tables.stats.rows_used, rows, "process 2 still uses it");
    tables.drop_process(2);
    assert_eq!(tables.stats.rows_used, 0);
    assert_eq!(tables.stats.trampoline_tables, 0);
    // Its trampolines gone from the maps (Python exited its perf mode).
    tables.sync(3, &[], &[], &python_jit(), |_| None);
    tables.sync(3, &[], &[], &JitCode::EMPTY, |_| None);
    assert_eq!(tables.stats.rows_used, 0);
}

#[test]
fn no_rows_for_a_shape_leaves_its_spans_to_frame_pointers_counted() {
    let (shared, mut tables) = fake(1000, 1 << 16);
    tables.sync(1, &[], &[], &python_jit(), |_| None);
    assert_eq!(tables.stats.rows_used, 0);
    assert_eq!(tables.stats.rows_full, 1, "once for the read");
    let f = shared.0.borrow();
    assert_eq!(lookup(&f, 1, BASE).map(|v| v.kind), Some(MAPPING_FP_ONLY));
}
