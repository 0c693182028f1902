//! The policy's decisions at chosen instants: no sleeping, no /proc.

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_new_process_gets_a_few_quick_reads_then_one_per_interval() {
    let t0 = Instant::now();
    let mut p = ReadPolicy::read_at(t0);
    // Given maps just read: the first QUICK_READS reads are free
    for _ in 0..QUICK_READS {
        assert!(p.may_read(t0 + ms(1), MIN_REREAD_INTERVAL));
        p.read(t0 + ms(1));
    }
    // Then one more within the interval is refused
    assert!(!p.may_read(t0 + ms(2), MIN_REREAD_INTERVAL));
    // And once the interval passed, it is read
    assert!(p.may_read(t0 + ms(1) + MIN_REREAD_INTERVAL, MIN_REREAD_INTERVAL));
}

#[test]
fn maps_that_could_not_be_read_are_not_tried_again_within_the_interval() {
    let t0 = Instant::now();
    let mut p = ReadPolicy::default();
    assert!(p.may_read(t0, MIN_REREAD_INTERVAL), "never read: read");
    p.unread(t0);
    assert!(!p.may_read(t0 + ms(50), MIN_REREAD_INTERVAL));
    assert!(p.may_read(t0 + ms(100), MIN_REREAD_INTERVAL));
}

#[test]
fn an_exec_makes_a_new_process_of_it() {
    let t0 = Instant::now();
    let mut p = ReadPolicy::read_at(t0);
    p.unread(t0);
    assert!(p.after_walk_end(0x10, t0 + MIN_WALK_REREAD_INTERVAL));
    p.exec();
    assert_eq!(p.walk_ends(), 0);
    assert!(p.may_read(t0, MIN_REREAD_INTERVAL));
}

/// A walk that first ends at an address reads the maps soon, at most
/// every MIN_WALK_REREAD_INTERVAL; one refused is a first one still.
#[test]
fn first_walk_ends_read_the_maps_at_most_every_few_milliseconds() {
    let t0 = Instant::now();
    // Given maps just read, with the quick reads after exec used up
    let mut p = ReadPolicy::read_at(t0);
    p.unread(t0);
    // When a walk first ends at an address now
    // Then the maps are not read, and the address is not taken as seen
    assert!(!p.after_walk_end(0x10, t0));
    assert_eq!(p.walk_ends(), 0);
    // And once the interval passed, the same address reads them
    assert!(p.after_walk_end(0x10, t0 + MIN_WALK_REREAD_INTERVAL));
    assert_eq!(p.walk_ends(), 1);
}

#[test]
fn a_walk_ending_again_where_one_ended_reads_as_rarely_as_any_read() {
    let t0 = Instant::now();
    let mut p = ReadPolicy::read_at(t0);
    p.unread(t0);
    let after = t0 + MIN_WALK_REREAD_INTERVAL;
    assert!(p.after_walk_end(0x10, after));
    p.read(after);
    // The same address again: the long interval
    assert!(!p.after_walk_end(0x10, after + MIN_WALK_REREAD_INTERVAL));
    assert!(p.after_walk_end(0x10, after + MIN_REREAD_INTERVAL));
    // Until the code changes: then it is a first end again
    p.read(after + MIN_REREAD_INTERVAL);
    p.code_changed();
    assert!(p.after_walk_end(0x10, after + MIN_REREAD_INTERVAL + MIN_WALK_REREAD_INTERVAL));
}

#[test]
fn where_walks_ended_is_bounded() {
    let t0 = Instant::now();
    let mut p = ReadPolicy::default();
    for pc in 0..MAX_ENDED_AT as u64 + 10 {
        p.after_walk_end(pc, t0);
    }
    assert_eq!(p.walk_ends(), MAX_ENDED_AT);
}
