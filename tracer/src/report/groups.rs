//! `--group-by cgroup|container`: which group each stack's process is in
//! (by its `Identity`), and each group's totals. The text report lists the
//! groups first, collapsed stacks and flamegraphs put the group as their
//! root frame, JSON writes them as `groups`.

use std::collections::HashMap;

use serde::Serialize;

use super::{Counts, GroupBy, Identity, Profile, StackReport};

/// Shown for a process whose cgroup (or container) is not known, and for
/// folded exited processes.
const NO_CGROUP: &str = "[cgroup unknown]";
const NO_CONTAINER: &str = "[no container]";

/// One group of processes and what their stacks sum to.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Group {
    /// How reports name it: a cgroup path, `container <id>`, `pod <uid>`,
    /// `unit <name>`, or `[no container]` / `[cgroup unknown]`.
    pub group: String,
    /// What its processes share (the cgroup path only under --group-by
    /// cgroup; the container, pod or unit under --group-by container).
    pub cgroup: Option<String>,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub unit: Option<String>,
    /// Host pids of its processes with stacks (0 for folded exited ones).
    pub pids: Vec<u32>,
    #[serde(flatten)]
    pub counts: Counts,
}

impl Profile {
    /// The identity of process (`pid`, `start_time`), found as
    /// `process_label` finds the process.
    pub fn identity_of(&self, pid: u32, start_time: Option<u64>) -> Option<&Identity> {
        self.processes
            .iter()
            .find(|proc| proc.pid == pid && proc.start_time == start_time && proc.folded == 0)
            .or_else(|| {
                self.processes
                    .iter()
                    .find(|proc| proc.pid == pid && proc.folded == 0)
            })
            .map(|proc| &proc.identity)
    }

    /// The group of `stack` under `group_by`, as a `Group` with no counts
    /// (None under `process`).
    pub fn group_of(&self, stack: &StackReport) -> Option<Group> {
        let identity = match stack.exited_group {
            Some(_) => None,
            None => self.identity_of(stack.pid, stack.start_time),
        };
        group_for(self.group_by, identity, |id| self.shown_container(id))
    }

    /// Container `id` as reports name it: its first 12 digits, as `docker
    /// ps` shows it, or as many more as tell it apart from another
    /// container of the profile that starts with the same 12 (the runtime
    /// picks the ids; two must not merge into one group). O(processes).
    fn shown_container<'a>(&self, id: &'a str) -> &'a str {
        let mut len = SHORT_ID.min(id.len());
        let others = self
            .processes
            .iter()
            .filter_map(|p| p.identity.container_id.as_deref());
        for other in others {
            if other != id && other.get(..len) == id.get(..len) {
                let common = id
                    .bytes()
                    .zip(other.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                len = (common + 1).min(id.len());
            }
        }
        id.get(..len).unwrap_or(id)
    }

    /// Every group with its processes and summed counts, largest in-use
    /// first (then by name); empty under `--group-by process`.
    pub fn groups(&self) -> Vec<Group> {
        if self.group_by == GroupBy::Process {
            return Vec::new();
        }
        let mut by_name: HashMap<String, Group> = HashMap::new();
        let mut of_process: HashMap<(u32, Option<u64>, bool), Option<Group>> = HashMap::new();
        for stack in &self.stacks {
            let key = (stack.pid, stack.start_time, stack.exited_group.is_some());
            let Some(found) = of_process
                .entry(key)
                .or_insert_with(|| self.group_of(stack))
                .clone()
            else {
                continue;
            };
            let group = by_name.entry(found.group.clone()).or_insert(found);
            if !group.pids.contains(&stack.pid) {
                group.pids.push(stack.pid);
            }
            let (c, s) = (&mut group.counts, &stack.counts);
            c.inuse_bytes = c.inuse_bytes.saturating_add(s.inuse_bytes);
            c.inuse_objects = c.inuse_objects.saturating_add(s.inuse_objects);
            c.alloc_bytes = c.alloc_bytes.saturating_add(s.alloc_bytes);
            c.alloc_objects = c.alloc_objects.saturating_add(s.alloc_objects);
            // The sum of its processes' peaks (each at its own moment).
            c.peak_inuse_bytes = c.peak_inuse_bytes.saturating_add(s.peak_inuse_bytes);
            c.peak_inuse_objects = c.peak_inuse_objects.saturating_add(s.peak_inuse_objects);
        }
        let mut groups: Vec<Group> = by_name.into_values().collect();
        for g in &mut groups {
            g.pids.sort_unstable();
        }
        groups.sort_by(|a, b| {
            (b.counts.inuse_bytes, b.counts.alloc_bytes, &a.group).cmp(&(
                a.counts.inuse_bytes,
                a.counts.alloc_bytes,
                &b.group,
            ))
        });
        groups
    }
}

/// The group a process with `identity` (None: unknown) is in; `shown`
/// names a container.
fn group_for(
    group_by: GroupBy,
    identity: Option<&Identity>,
    shown: impl Fn(&str) -> &str,
) -> Option<Group> {
    let none = Identity::default();
    let id = identity.unwrap_or(&none);
    match group_by {
        GroupBy::Process => None,
        GroupBy::Cgroup => Some(Group {
            group: id.cgroup.clone().unwrap_or_else(|| NO_CGROUP.to_string()),
            cgroup: id.cgroup.clone(),
            ..Group::default()
        }),
        GroupBy::Container => {
            let group = if let Some(c) = &id.container_id {
                format!("container {}", shown(c))
            } else if let Some(pod) = &id.pod_uid {
                format!("pod {pod}")
            } else if let Some(unit) = &id.unit {
                format!("unit {unit}")
            } else {
                NO_CONTAINER.to_string()
            };
            Some(Group {
                group,
                container_id: id.container_id.clone(),
                pod_uid: id.pod_uid.clone(),
                unit: id.unit.clone(),
                ..Group::default()
            })
        }
    }
}

/// Digits of a container id that `docker ps` shows.
const SHORT_ID: usize = 12;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ProcessInfo;

    fn process(pid: u32, cgroup: &str, container: Option<&str>) -> ProcessInfo {
        ProcessInfo {
            pid,
            identity: Identity {
                cgroup: Some(cgroup.to_string()),
                container_id: container.map(str::to_string),
                ..Identity::default()
            },
            ..ProcessInfo::default()
        }
    }

    fn stack(pid: u32, inuse: u64) -> StackReport {
        StackReport {
            pid,
            counts: Counts {
                inuse_bytes: inuse,
                inuse_objects: 1,
                alloc_bytes: inuse,
                alloc_objects: 1,
                ..Counts::default()
            },
            ..StackReport::default()
        }
    }

    #[test]
    fn stacks_are_summed_per_cgroup_and_per_container() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let mut p = Profile {
            processes: vec![
                process(1, "/a", Some(id)),
                process(2, "/a", Some(id)),
                process(3, "/b", None),
            ],
            stacks: vec![stack(1, 10), stack(2, 20), stack(3, 5), stack(9, 1)],
            group_by: GroupBy::Cgroup,
            ..Profile::default()
        };
        let got: Vec<(String, Vec<u32>, u64)> = p
            .groups()
            .into_iter()
            .map(|g| (g.group, g.pids, g.counts.inuse_bytes))
            .collect();
        assert_eq!(
            got,
            [
                ("/a".to_string(), vec![1, 2], 30),
                ("/b".to_string(), vec![3], 5),
                (NO_CGROUP.to_string(), vec![9], 1),
            ]
        );
        p.group_by = GroupBy::Container;
        let names: Vec<String> = p.groups().into_iter().map(|g| g.group).collect();
        assert_eq!(names, ["container 0123456789ab", NO_CONTAINER]);
        p.group_by = GroupBy::Process;
        assert!(p.groups().is_empty());
    }

    /// Two containers whose ids share their first 12 digits are two
    /// groups, each named by as many digits as tell it apart (they were one
    /// group, with the first one's id and both pids).
    #[test]
    fn containers_that_share_12_digits_stay_apart() {
        let a = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let b = "0123456789abffffffffffffffffffffffffffffffffffffffffffffffffffff";
        let c = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
        let p = Profile {
            processes: vec![
                process(1, "/a", Some(a)),
                process(2, "/b", Some(b)),
                process(3, "/c", Some(c)),
            ],
            stacks: vec![stack(1, 30), stack(2, 20), stack(3, 10)],
            group_by: GroupBy::Container,
            ..Profile::default()
        };
        let got: Vec<(String, Option<String>, Vec<u32>)> = p
            .groups()
            .into_iter()
            .map(|g| (g.group, g.container_id, g.pids))
            .collect();
        assert_eq!(
            got,
            [
                ("container 0123456789abc".into(), Some(a.into()), vec![1]),
                ("container 0123456789abf".into(), Some(b.into()), vec![2]),
                ("container fedcba987654".into(), Some(c.into()), vec![3]),
            ]
        );
    }

    #[test]
    fn the_group_is_the_root_frame_and_the_text_report_lists_groups_escaped() {
        // A container runtime picks its cgroup names: control bytes, `;`
        // and a trailing number must neither forge lines nor frames.
        let evil = "/evil;x\n\x1b[2J 7";
        let p = Profile {
            processes: vec![process(1, "/a", None), process(2, evil, None)],
            stacks: vec![stack(1, 10), stack(2, 20)],
            group_by: GroupBy::Cgroup,
            ..Profile::default()
        };
        let mut out = Vec::new();
        crate::report::write_collapsed(&p, crate::report::View::InuseSpace, &mut out)
            .expect("render");
        let out = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("/a;pid (pid 1);"), "{out}");
        assert!(lines[1].starts_with("/evil:x\\n\\x1b[2J\\x207;"), "{out}");
        let mut text = Vec::new();
        crate::report::write_text(&p, 10, &mut text).expect("render");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(!text.contains('\x1b'), "{text}");
        assert!(text.contains("By cgroup:"), "{text}");
        assert!(text.contains("#1  20 bytes in 1 object"), "{text}");
        assert!(text.contains("pid 1 in /a"), "{text}");
    }
}
