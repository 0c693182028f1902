//! The memory budget against what a trace writes: a JSON shaped like the
//! 73 MB one a trace of cc1plus wrote (tests/integration/big_saved.rs
//! reads one that large) is estimated within `MAX_PROFILE_BYTES` /
//! `MAX_INPUT_BYTES` times its size, so one of up to `MAX_INPUT_BYTES`
//! is read.

use std::sync::Arc;

use crate::report::{self, Counts, Frame, Profile, StackReport};
use crate::saved::{limits::Budget, read_json, MAX_INPUT_BYTES, MAX_PROFILE_BYTES};

/// Stacks of 30 to 70 frames from a table of 10,000 (indices of 4 and 5
/// digits, as in a file this large), leaf first.
fn trace_shaped(stacks: usize) -> Profile {
    let table: Vec<Arc<Frame>> = (0..10_000)
        .map(|i| {
            Arc::new(Frame {
                function: format!("cp_parser_expression_{i}(cp_parser*, cp_expr*, bool, bool)"),
                module: "/usr/lib/gcc/x86_64-linux-gnu/14/cc1plus".into(),
                offset: 0x40_0000 + 16 * i as u64,
                file: Some(format!("../../src/gcc/cp/parser{}.cc", i % 40)),
                line: Some(100 + i as u32),
                ..Frame::default()
            })
        })
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as usize
    };
    let stacks = (0..stacks)
        .map(|i| {
            let depth = 30 + next() % 40;
            let frames: Vec<Arc<Frame>> = (0..depth)
                .map(|_| Arc::clone(&table[next() % table.len()]))
                .collect();
            StackReport {
                pid: 4242,
                start_time: Some(123_456),
                counts: Counts {
                    inuse_bytes: 16 + i as u64,
                    inuse_objects: 1,
                    alloc_bytes: 48 + i as u64,
                    alloc_objects: 3,
                    ..Counts::default()
                },
                frames: frames.into(),
                ..StackReport::default()
            }
        })
        .collect();
    Profile {
        stacks,
        ..Profile::default()
    }
}

#[test]
fn a_trace_shaped_json_is_estimated_within_the_budget_per_input_byte() {
    let mut doc = Vec::new();
    report::write_json(&trace_shaped(20_000), &mut doc).expect("json");
    let size = doc.len();
    let mut budget = Budget::new(MAX_PROFILE_BYTES);
    read_json::parse(doc, &mut budget).expect("read back");
    let ratio = budget.spent() as f64 / size as f64;
    let allowed = MAX_PROFILE_BYTES as f64 / MAX_INPUT_BYTES as f64;
    assert!(
        ratio <= allowed,
        "{size} bytes of JSON spent {} bytes: {ratio:.2} times, more than {allowed}",
        budget.spent()
    );
}
