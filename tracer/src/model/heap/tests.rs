use super::*;

#[test]
fn exec_drops_the_old_images_blocks_and_their_late_frees_match() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 0);
    h.alloc(1, 0x20, 50, 1.0, 7, 0);
    h.alloc(2, 0x10, 10, 1.0, 8, 0);
    h.drop_process(1);
    assert_eq!(h.dropped_by_exec, 2);
    let c = counts(&h, 7);
    assert_eq!((c.inuse_bytes, c.alloc_bytes), (0, 150));
    // BPF's stale entry for 0x10 is freed by the new image: expected.
    assert!(h.free(1, 0x10));
    // 0x20 is reused by a recorded allocation, then freed twice over.
    h.alloc(1, 0x20, 5, 1.0, 9, 0);
    assert!(h.is_live(1, 0x20));
    assert!(h.free(1, 0x20));
    assert!(!h.free(1, 0x20), "unmatched");
    assert_eq!(counts(&h, 8).inuse_bytes, 10);
    assert_eq!(h.live_blocks(), 1);
}

#[test]
fn given_the_exit_that_ends_the_trace_then_inuse_stays_and_the_pid_and_addresses_are_free() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 0);
    h.alloc(1, 0x20, 50, 1.0, 7, 0);
    h.free(1, 0x20);
    h.alloc(2, 0x10, 10, 1.0, 8, 0);
    h.drop_process(2); // exec: its block's LIVE entry is stale
    h.alloc(2, 0x30, 5, 1.0, 9, 0);
    let mut gone = h.exited(1, true);
    gone.sort_unstable();
    assert_eq!(gone, [0x10]);
    let mut gone = h.exited(2, true);
    gone.sort_unstable();
    assert_eq!(gone, [0x10, 0x30]);
    assert_eq!((h.live_at_exit, h.live_blocks()), (2, 0));
    // What each had not freed is still in use.
    assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
    assert_eq!(counts(&h, 9), c(5, 1, 5, 1));
    // A new process with pid 1 allocating at 0x10 replaces nothing.
    h.alloc(1, 0x10, 1, 1.0, 10, 0);
    assert_eq!(h.replaced_allocs, 0);
    assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
}

#[test]
fn given_exits_folded_into_one_stack_then_it_counts_every_process_that_left_blocks() {
    let mut h = Heap::default();
    // Three processes leave blocks at their own stack 1, 2, 3; stack 4
    // is freed before its process exits.
    for pid in 1..=3u32 {
        h.alloc(pid, 0x10, 100, 1.0, pid, 0);
        h.alloc(pid, 0x20, 100, 1.0, pid, 0);
    }
    h.alloc(4, 0x10, 100, 1.0, 4, 0);
    h.free(4, 0x10);
    for pid in 1..=4 {
        h.exited(pid, false);
    }
    // Folded into the program's group stack 9, as --exited-processes does.
    for from in 1..=4 {
        h.merge(from, 9, None);
    }
    let at_exit: Vec<_> = h.unfreed_at_exit().collect();
    assert_eq!(
        at_exit,
        [(
            9,
            Unfreed {
                bytes: 600,
                objects: 6,
                processes: 3,
            }
        )]
    );
    assert_eq!(h.exited_with_unfreed, 3);
}

#[test]
fn given_an_exit_during_the_trace_then_what_was_not_freed_leaves_inuse_for_at_exit() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 0);
    h.alloc(1, 0x20, 50, 2.0, 7, 0);
    h.alloc(1, 0x30, 8, 1.0, 9, 0);
    h.free(1, 0x30);
    h.alloc(2, 0x10, 10, 1.0, 7, 0);
    let mut gone = h.exited(1, false);
    gone.sort_unstable();
    assert_eq!(gone, [0x10, 0x20]);
    assert_eq!(h.exited_with_unfreed, 1);
    // Process 2 still holds its block; process 1's moved out of in-use.
    assert_eq!(counts(&h, 7), c(10, 1, 210, 4));
    let at_exit: Vec<_> = h.unfreed_at_exit().collect();
    assert_eq!(
        at_exit,
        [(
            7,
            Unfreed {
                bytes: 200,
                objects: 3,
                processes: 1,
            }
        )]
    );
    // A late free for a block of the exited process matches nothing.
    h.free(1, 0x10);
    assert_eq!(counts(&h, 7), c(10, 1, 210, 4));
    // An exit with nothing live adds no process.
    h.exited(3, false);
    assert_eq!(h.exited_with_unfreed, 1);
}

#[test]
fn given_a_merge_then_the_numbers_move_and_the_old_stack_is_gone() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 0);
    h.alloc(1, 0x20, 50, 1.0, 7, 0);
    h.free(1, 0x20);
    h.exited(1, false);
    h.alloc(2, 0x10, 10, 1.0, 9, 0);
    h.free(2, 0x10);
    h.merge(7, 9, None);
    h.merge(3, 9, None); // unknown: nothing
    assert_eq!(h.stacks().count(), 1);
    assert_eq!(counts(&h, 9), c(0, 0, 160, 3));
    let at_exit: Vec<_> = h.unfreed_at_exit().collect();
    assert_eq!(
        at_exit,
        [(
            9,
            Unfreed {
                bytes: 100,
                objects: 1,
                processes: 1,
            }
        )]
    );
}

const SEC: u64 = 1_000_000_000;

#[test]
fn a_live_block_is_24_bytes() {
    assert_eq!(std::mem::size_of::<LiveBlock>(), 24);
}

#[test]
fn given_blocks_of_several_ages_then_min_age_counts_only_the_old_ones_weighted() {
    // Boot clock at 1000 s; the trace's allocations at 1000, 1003, 1009 s.
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 1000 * SEC);
    h.alloc(1, 0x20, 50, 2.0, 7, 1003 * SEC);
    h.alloc(2, 0x30, 8, 1.0, 9, 1009 * SEC);
    h.alloc(1, 0x40, 1, 1.0, 9, 1000 * SEC);
    h.free(1, 0x40);
    let aged = |now: u64, min_age: u64| {
        let mut v: Vec<_> = h
            .inuse_older_than(now * SEC, min_age * SEC)
            .into_iter()
            .collect();
        v.sort_unstable_by_key(|(s, _)| *s);
        v
    };
    let inuse = |bytes, objects| InUse { bytes, objects };
    // At 1010 s: ages 10, 7 and 1 s.
    assert_eq!(aged(1010, 0), [(7, inuse(200, 3)), (9, inuse(8, 1))]);
    assert_eq!(aged(1010, 5), [(7, inuse(200, 3))]);
    assert_eq!(aged(1010, 7), [(7, inuse(200, 3))]);
    assert_eq!(aged(1010, 8), [(7, inuse(100, 1))]);
    assert_eq!(aged(1010, 11), []);
    // Older than the clock itself, or than the first allocation.
    assert_eq!(aged(5, 10), []);
    // Allocated counts and the unfiltered in-use are unchanged.
    assert_eq!(counts(&h, 7), c(200, 3, 200, 3));
    assert_eq!(h.inuse_bytes(), 208);
    // Ages are kept to 10 ms, rounded so that a block is never counted
    // before it is old enough.
    let mut h = Heap::default();
    h.alloc(1, 0x10, 5, 1.0, 1, 7 * SEC + 1);
    assert!(h.inuse_older_than(9 * SEC, 2 * SEC).is_empty());
    assert_eq!(h.inuse_older_than(9 * SEC + AGE_TICK_NS, 2 * SEC).len(), 1);
}

#[test]
fn given_a_window_then_only_blocks_allocated_in_it_are_in_use() {
    // Allocations at 1000, 1003 and 1009 s; a window from 1002 to 1010 s.
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 1000 * SEC);
    h.alloc(1, 0x20, 50, 2.0, 7, 1003 * SEC);
    h.alloc(2, 0x30, 8, 1.0, 9, 1009 * SEC);
    let window = |from: u64, until: u64| {
        let mut v: Vec<_> = h
            .inuse_born_between(from * SEC, until * SEC)
            .into_iter()
            .collect();
        v.sort_unstable_by_key(|(s, _)| *s);
        v
    };
    let inuse = |bytes, objects| InUse { bytes, objects };
    assert_eq!(window(1002, 1010), [(7, inuse(100, 2)), (9, inuse(8, 1))]);
    assert_eq!(window(1004, 1010), [(9, inuse(8, 1))]);
    // Both ends: a window that ends before the last allocation.
    assert_eq!(window(1002, 1005), [(7, inuse(100, 2))]);
    assert_eq!(window(1000, 1000), [(7, inuse(100, 1))]);
    assert_eq!(window(1010, 1020), []);
    // A block allocated just after the window opens is in it.
    let mut h = Heap::default();
    h.alloc(1, 0x10, 5, 1.0, 1, 7 * SEC);
    h.alloc(1, 0x20, 5, 1.0, 1, 9 * SEC + 1);
    assert_eq!(h.inuse_born_between(9 * SEC, 10 * SEC)[&1], inuse(5, 1));
}

#[test]
fn given_the_exit_that_ends_the_trace_then_min_age_still_sees_its_blocks() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 1.0, 7, 10 * SEC);
    h.alloc(1, 0x20, 30, 1.0, 8, 20 * SEC);
    h.alloc(2, 0x10, 40, 1.0, 7, 10 * SEC);
    h.exited(1, true);
    h.exited(2, false); // "not freed at exit": not in use at any age
    let aged = h.inuse_older_than(25 * SEC, 10 * SEC);
    assert_eq!(
        aged.into_iter().collect::<Vec<_>>(),
        [(
            7,
            InUse {
                bytes: 100,
                objects: 1
            }
        )]
    );
}

fn counts(h: &Heap, stack: StackHandle) -> Counts {
    h.stacks()
        .find(|(s, _)| *s == stack)
        .map(|(_, c)| c)
        .unwrap_or_default()
}

fn c(inuse_bytes: u64, inuse_objects: u64, alloc_bytes: u64, alloc_objects: u64) -> Counts {
    Counts {
        inuse_bytes,
        inuse_objects,
        alloc_bytes,
        alloc_objects,
        ..Counts::default()
    }
}

#[test]
fn given_allocs_and_frees_then_inuse_is_what_remains() {
    let mut h = Heap::default();
    h.alloc(1, 0x1000, 100, 1.0, 7, 0);
    h.alloc(1, 0x2000, 50, 1.0, 7, 0);
    h.alloc(1, 0x3000, 8, 1.0, 9, 0);
    h.free(1, 0x2000);
    assert_eq!(counts(&h, 7), c(100, 1, 150, 2));
    assert_eq!(counts(&h, 9), c(8, 1, 8, 1));
    assert_eq!(h.live_blocks(), 2);
}

#[test]
fn given_a_realloc_chain_then_only_the_last_block_is_inuse() {
    // realloc in place and moving: BPF sends FREE(old) then ALLOC(new).
    let mut h = Heap::default();
    h.alloc(1, 0xa0, 100, 1.0, 3, 0);
    assert!(h.free(1, 0xa0));
    h.alloc(1, 0xa0, 200, 1.0, 3, 0); // grown in place
    assert!(h.free(1, 0xa0));
    h.alloc(1, 0xb0, 400, 1.0, 3, 0); // moved
    assert_eq!(counts(&h, 3), c(400, 1, 700, 3));
    assert_eq!(h.live_blocks(), 1);
}

#[test]
fn given_a_free_of_an_unknown_address_then_it_is_said_unknown_and_ignored() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 10, 1.0, 1, 0);
    assert!(!h.free(1, 0x999));
    assert!(!h.free(2, 0x10), "same address, other process");
    assert!(h.is_live(1, 0x10) && !h.is_live(2, 0x10));
    assert_eq!(counts(&h, 1), c(10, 1, 10, 1));
}

#[test]
fn given_a_lost_free_then_the_reused_address_replaces_the_old_block() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 10, 1.0, 1, 0);
    h.alloc(1, 0x10, 20, 1.0, 2, 0);
    assert_eq!(h.replaced_allocs, 1);
    assert_eq!(counts(&h, 1), c(0, 0, 10, 1));
    assert_eq!(counts(&h, 2), c(20, 1, 20, 1));
}

#[test]
fn given_weighted_samples_then_totals_are_weighted_and_frees_remove_them() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 100, 40.0, 5, 0);
    h.alloc(1, 0x20, 5000, 1.5, 5, 0);
    assert_eq!(counts(&h, 5), c(11_500, 42, 11_500, 42));
    h.free(1, 0x10);
    assert_eq!(counts(&h, 5), c(7_500, 2, 11_500, 42));
}

#[test]
fn given_churn_then_inuse_is_zero_and_alloc_counts_everything() {
    let mut h = Heap::default();
    for i in 0..1000u64 {
        h.alloc(1, 0x100 + (i % 3) * 16, 32, 1.0, 4, 0);
        h.free(1, 0x100 + (i % 3) * 16);
    }
    assert_eq!(counts(&h, 4), c(0, 0, 32_000, 1000));
}

fn at_peak(h: &Heap, pid: u32, stack: StackHandle) -> (u64, u64) {
    let p = h.peak(pid).copied();
    let at = h.stack_peak(stack, p.as_ref());
    (at.bytes, at.objects)
}

#[test]
fn given_a_burst_freed_then_the_peak_holds_every_stack_as_it_was_then() {
    let mut h = Heap::default();
    h.alloc(1, 0x10, 4096, 1.0, 1, 10); // held
    h.alloc(1, 0x20, 1000, 1.0, 2, 20); // the burst
    h.alloc(1, 0x30, 1000, 1.0, 2, 30); // the peak: 6096 bytes
    h.alloc(2, 0x10, 99_999, 1.0, 5, 35); // another process: its own peak
    h.free(1, 0x20);
    h.free(1, 0x30);
    h.alloc(1, 0x40, 500, 1.0, 3, 40); // a lower burst
    h.alloc(1, 0x50, 100, 1.0, 1, 50); // a leak
    h.free(1, 0x40);
    let p = h.peak(1).copied().unwrap();
    assert_eq!(
        (p.peak_bytes, p.peak_objects, p.at_ns),
        (6096.0, 3.0, Some(30))
    );
    assert_eq!(at_peak(&h, 1, 1), (4096, 1));
    assert_eq!(at_peak(&h, 1, 2), (2000, 2));
    assert_eq!(at_peak(&h, 1, 3), (0, 0));
    assert_eq!(at_peak(&h, 2, 5), (99_999, 1));
    // The same address again (its FREE lost) replaces the block: the
    // stack's peak value stays.
    h.alloc(1, 0x10, 8, 1.0, 1, 60);
    assert_eq!(at_peak(&h, 1, 1), (4096, 1));
    // exec: the old image's blocks go; a larger heap after it is a new peak.
    h.drop_process(1);
    h.alloc(1, 0x60, 10_000, 1.0, 4, 70);
    assert_eq!(at_peak(&h, 1, 1), (0, 0));
    assert_eq!(at_peak(&h, 1, 4), (10_000, 1));
    // Exit and fold: the group stack keeps what the stack held at the peak.
    h.exited(1, false);
    let p = h.take_peak(1);
    assert_eq!(p.map(|p| p.peak_bytes), Some(10_000.0));
    assert!(h.peak(1).is_none(), "a new process 1 starts from nothing");
    h.merge(4, 9, p.as_ref());
    h.merge(1, 9, p.as_ref());
    assert_eq!(
        h.stack_peak(9, None),
        InUse {
            bytes: 10_000,
            objects: 1
        }
    );
}

#[test]
fn given_snapshot_on_peak_then_only_the_whole_trace_growing_raises_the_flag() {
    let mib = 1 << 20;
    let mut h = Heap {
        peak_trigger: Some(PeakTrigger::new(0.1)),
        ..Heap::default()
    };
    let grown = |h: &Heap| h.peak_trigger.is_some_and(|t| t.grown());
    h.alloc(1, 0x10, 10 * mib, 1.0, 1, 1);
    assert!(grown(&h), "the first allocation is a new high");
    h.peak_trigger.as_mut().expect("on").taken();
    // Processes that start and exit: each one's first block is its own
    // new high, not the trace's.
    for pid in 2..100 {
        h.alloc(pid, 0x10, mib / 2, 1.0, 2, 2);
        h.exited(pid, false);
    }
    assert!(!grown(&h));
    h.alloc(1, 0x20, mib / 2, 1.0, 1, 3); // 10.5 MiB: not above 1.1 × 10
    assert!(!grown(&h));
    h.alloc(1, 0x30, mib, 1.0, 1, 4);
    assert!(grown(&h));
}
