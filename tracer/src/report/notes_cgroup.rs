//! The words of `Note::CgroupRemoved` (when the traced cgroup went, and
//! when one came back at its path) and `Note::CgroupByProcesses`.

use std::fmt;

use super::{counted, plural};
use crate::profile::CgroupRemoval;

/// "the cgroup /x.service was removed during the trace: at 3.2 s, made
/// again at 3.4 s; ...".
pub(super) fn removed(
    f: &mut fmt::Formatter<'_>,
    path: &str,
    removals: &[CgroupRemoval],
    more: u64,
) -> fmt::Result {
    write!(f, "the cgroup {path} was removed during the trace: ")?;
    for (i, r) in removals.iter().enumerate() {
        if i > 0 {
            f.write_str("; ")?;
        }
        write!(f, "at {:.1} s, ", r.removed.as_secs_f64())?;
        match r.made_again {
            Some(at) => write!(f, "made again at {:.1} s", at.as_secs_f64())?,
            None => f.write_str("not made again by the end of the trace")?,
        }
    }
    if more > 0 {
        write!(f, "; and {} after those", counted(more, "time", "times"))?;
    }
    f.write_str(
        ". A cgroup made again at that path is traced from when the tracer sees it (it looks \
         every 100 ms): what its processes allocated before that is not in the report",
    )
}

/// "the cgroup /x.service was followed by its process list: ...".
pub(super) fn by_processes(
    f: &mut fmt::Formatter<'_>,
    path: &str,
    not_traced: u64,
    max_pids: u32,
) -> fmt::Result {
    write!(
        f,
        "the cgroup {path} was followed by its process list, as this kernel's BPF cannot ask \
         a uprobe's cgroup: its processes were traced by pid, their children from their \
         fork, and a process moved in from the tracer's next look at the cgroup (every \
         100 ms)"
    )?;
    if not_traced > 0 {
        write!(
            f,
            "; {} of it {} not traced when found, the process filter map ({max_pids} entries) \
             full, until others exited or left",
            counted(not_traced, "process", "processes"),
            plural(not_traced, "was", "were"),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::profile::{CgroupRemoval, Note};

    #[test]
    fn each_removal_says_when_and_whether_the_cgroup_came_back() {
        let note = Note::CgroupRemoved {
            path: "/system.slice/x.service".into(),
            removals: vec![
                CgroupRemoval {
                    removed: Duration::from_millis(3_240),
                    made_again: Some(Duration::from_millis(3_410)),
                },
                CgroupRemoval {
                    removed: Duration::from_millis(10_050),
                    made_again: None,
                },
            ],
            more: 2,
        };
        assert_eq!(
            note.to_string(),
            "the cgroup /system.slice/x.service was removed during the trace: at 3.2 s, made \
             again at 3.4 s; at 10.1 s, not made again by the end of the trace; and 2 times \
             after those. A cgroup made again at that path is traced from when the tracer sees \
             it (it looks every 100 ms): what its processes allocated before that is not in the \
             report"
        );
    }

    #[test]
    fn a_cgroup_followed_by_its_processes_says_so_and_counts_those_left_out() {
        let note = |not_traced| Note::CgroupByProcesses {
            path: "/a".into(),
            not_traced,
            max_pids: 8192,
        };
        assert_eq!(
            note(0).to_string(),
            "the cgroup /a was followed by its process list, as this kernel's BPF cannot ask a \
             uprobe's cgroup: its processes were traced by pid, their children from their fork, \
             and a process moved in from the tracer's next look at the cgroup (every 100 ms)"
        );
        assert!(note(1).to_string().ends_with(
            "; 1 process of it was not traced when found, the process filter map (8192 \
             entries) full, until others exited or left"
        ));
    }
}
