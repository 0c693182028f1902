//! `--cgroup` on a kernel whose verifier does not offer
//! `bpf_get_current_ancestor_cgroup_id` to uprobe programs (Debian's
//! 5.10): the subtree is followed by its process list. Its processes go
//! into the TRACED map (FILTER_PIDS), and their children join it in the
//! kernel at fork (FORKS_FOLLOW, as under --follow-forks), so none of a
//! child's calls is missed. The session reads the subtree's `cgroup.procs`
//! again at each look (every POLL_INTERVAL): a process moved in joins
//! TRACED then, one moved out leaves it. The kernel takes a process out of
//! TRACED at its exit.
//!
//! A race it leaves: a process that exits and whose pid a traced process's
//! new child takes before the look that finds it gone (its exit event not
//! handled yet) leaves TRACED at that look, and joins again at the next.

use std::collections::BTreeSet;

use crate::probes::loader::Loaded;

/// What following the subtree needs of the TRACED map: `Loaded` in a
/// trace, a fake in the tests.
pub trait PidFilter {
    /// Adds `pid`; false when the map did not take it (full).
    fn add(&mut self, pid: u32) -> bool;
    /// Removes `pid` (one the kernel removed already is no error).
    fn remove(&mut self, pid: u32);
}

impl PidFilter for Loaded {
    fn add(&mut self, pid: u32) -> bool {
        self.add_filtered_pid(pid).is_ok()
    }

    fn remove(&mut self, pid: u32) {
        let _ = self.remove_filtered_pid(pid);
    }
}

#[derive(Debug, Default)]
pub struct Members {
    /// Processes in TRACED as far as user space knows: those it put there
    /// and the children the kernel did (fork events). A pid enters once the
    /// map took it, so this is bounded by TRACED's size
    /// (MAX_FILTERED_PIDS); it leaves at its exit event or at the first
    /// look that does not find it in the subtree.
    traced: BTreeSet<u32>,
    /// Processes of the subtree the map did not take (full), tried again
    /// at the next look after one left it. Bounded by the subtree's
    /// processes: those no longer in it are dropped at each look.
    untraced: BTreeSet<u32>,
    /// Processes the map did not take when found (the note's count).
    untraced_total: u64,
    /// A process left TRACED since the untraced ones were last tried.
    room: bool,
    /// The map was found full once (said on stderr the first time).
    was_full: bool,
}

/// What one look changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Look {
    /// Processes that joined TRACED, whose maps to read now.
    pub joined: Vec<u32>,
    /// Processes that left it (moved out of the subtree).
    pub left: Vec<u32>,
    /// The map was full for the first time in the trace.
    pub first_full: bool,
}

impl Members {
    /// One look at the subtree: `now` is its processes, sorted, without
    /// the tracer and kernel threads. Those new to it join `filter`,
    /// those gone from it leave; a full map does not end the trace (the
    /// processes it did not take are counted, and tried again once room
    /// is made).
    pub fn sync(&mut self, now: &[u32], filter: &mut impl PidFilter) -> Look {
        let mut look = Look::default();
        let in_now = |pid: &u32| now.binary_search(pid).is_ok();
        look.left = self.traced.iter().copied().filter(|p| !in_now(p)).collect();
        for &pid in &look.left {
            filter.remove(pid);
            self.traced.remove(&pid);
            self.room = true;
        }
        self.untraced.retain(in_now);
        let retry = std::mem::take(&mut self.room);
        let mut full = false;
        for &pid in now {
            let waiting = self.untraced.contains(&pid);
            if self.traced.contains(&pid) || (waiting && !retry) {
                continue;
            }
            // Once the map refused one, the others of this look wait.
            if !full && filter.add(pid) {
                self.traced.insert(pid);
                self.untraced.remove(&pid);
                look.joined.push(pid);
                continue;
            }
            full = true;
            if self.untraced.insert(pid) {
                self.untraced_total += 1;
            }
        }
        look.first_full = full && !self.was_full;
        self.was_full |= full;
        look
    }

    /// Whether `pid` is in TRACED, as far as user space knows.
    pub fn is_traced(&self, pid: u32) -> bool {
        self.traced.contains(&pid)
    }

    /// A traced process forked `child`, which the kernel put in TRACED.
    pub fn forked(&mut self, child: u32) {
        self.traced.insert(child);
    }

    /// Process `pid` exited: the kernel took it out of TRACED.
    pub fn exited(&mut self, pid: u32) {
        if self.traced.remove(&pid) {
            self.room = true;
        }
    }

    /// Processes the map did not take when they were found.
    pub fn untraced_total(&self) -> u64 {
        self.untraced_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TRACED with room for `capacity` pids.
    struct Fake {
        pids: BTreeSet<u32>,
        capacity: usize,
    }

    impl PidFilter for Fake {
        fn add(&mut self, pid: u32) -> bool {
            if self.pids.len() >= self.capacity && !self.pids.contains(&pid) {
                return false;
            }
            self.pids.insert(pid)
        }

        fn remove(&mut self, pid: u32) {
            self.pids.remove(&pid);
        }
    }

    fn fake(capacity: usize) -> Fake {
        Fake {
            pids: BTreeSet::new(),
            capacity,
        }
    }

    fn in_map(f: &Fake) -> Vec<u32> {
        f.pids.iter().copied().collect()
    }

    #[test]
    fn processes_moved_in_join_and_those_moved_out_leave() {
        let (mut members, mut map) = (Members::default(), fake(100));
        let look = members.sync(&[10, 20], &mut map);
        assert_eq!(look.joined, [10, 20]);
        assert!(look.left.is_empty() && !look.first_full);
        // 30 moved in, 10 moved out.
        let look = members.sync(&[20, 30], &mut map);
        assert_eq!((look.joined, look.left), (vec![30], vec![10]));
        assert_eq!(in_map(&map), [20, 30]);
        // Nothing changed: nothing joins again.
        assert_eq!(members.sync(&[20, 30], &mut map), Look::default());
    }

    #[test]
    fn a_child_forked_in_the_kernel_stays_and_an_exit_is_not_a_move() {
        let (mut members, mut map) = (Members::default(), fake(100));
        members.sync(&[10], &mut map);
        // The kernel put 11 in the map at fork; the look finds it in the
        // subtree and keeps it, without adding it again.
        map.pids.insert(11);
        members.forked(11);
        assert_eq!(members.sync(&[10, 11], &mut map), Look::default());
        // 11 exited (the kernel removed it); 12 forked and moved out
        // before the look: it leaves.
        map.pids.remove(&11);
        members.exited(11);
        map.pids.insert(12);
        members.forked(12);
        let look = members.sync(&[10], &mut map);
        assert_eq!(look.left, [12]);
        assert_eq!(in_map(&map), [10]);
    }

    #[test]
    fn a_full_map_counts_the_processes_left_out_and_takes_them_once_room_is_made() {
        let (mut members, mut map) = (Members::default(), fake(2));
        let look = members.sync(&[1, 2, 3, 4], &mut map);
        assert_eq!(look.joined, [1, 2]);
        assert!(look.first_full);
        assert_eq!(members.untraced_total(), 2);
        // Still full, no one left: not tried again, not counted again,
        // not said again.
        assert_eq!(members.sync(&[1, 2, 3, 4], &mut map), Look::default());
        assert_eq!(members.untraced_total(), 2);
        // 1 exited: 3 takes its place; 4 still waits.
        map.pids.remove(&1);
        members.exited(1);
        let look = members.sync(&[2, 3, 4], &mut map);
        assert_eq!(look.joined, [3]);
        assert!(!look.first_full);
        assert_eq!(in_map(&map), [2, 3]);
        // 4 moved out while it waited: forgotten; the count stays.
        map.pids.remove(&2);
        members.exited(2);
        assert_eq!(members.sync(&[3], &mut map), Look::default());
        assert_eq!(members.untraced_total(), 2);
        assert_eq!(members.untraced.len(), 0);
    }
}
