//! The text report's parts for `--group-by cgroup|container` and process
//! identities: the groups table, each stack's group, and what a process
//! line says of where the process runs.

use std::io::{self, Write};

use crate::escape::text as esc;

use super::{counted, GroupBy, Identity, Profile, StackReport};

/// `By cgroup:` and one line per group, largest in-use first; nothing
/// under `--group-by process`.
pub fn write_groups(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    let title = match p.group_by {
        GroupBy::Process => return Ok(()),
        GroupBy::Cgroup => "By cgroup:",
        GroupBy::Container => "By container:",
    };
    writeln!(w, "{title}")?;
    for (i, g) in p.groups().iter().enumerate() {
        let c = &g.counts;
        let pids: Vec<String> = g.pids.iter().map(u32::to_string).collect();
        writeln!(
            w,
            "#{}  {} in {} (allocated: {} in {}) {}  [{} {}]",
            i + 1,
            counted(c.inuse_bytes, "byte", "bytes"),
            counted(c.inuse_objects, "object", "objects"),
            counted(c.alloc_bytes, "byte", "bytes"),
            counted(c.alloc_objects, "object", "objects"),
            esc(&g.group),
            if g.pids.len() == 1 { "pid" } else { "pids" },
            pids.join(" "),
        )?;
    }
    writeln!(w)
}

/// ` in /a/b` after a stack's pid: its group, under --group-by.
pub fn stack_group(p: &Profile, stack: &StackReport) -> String {
    match p.group_of(stack) {
        Some(g) => format!(" in {}", esc(&g.group)),
        None => String::new(),
    }
}

/// What a process line says of where it runs: `[pid 1 in its namespace]`,
/// `[its root runs /app/prog]`, `[container 0123456789ab]`, escaped.
pub fn identity_suffix(id: &Identity) -> String {
    let mut parts = Vec::new();
    if let Some(ns_pid) = id.ns_pid {
        parts.push(format!("pid {ns_pid} in its namespace"));
    }
    if let Some(program) = &id.ns_program {
        parts.push(format!("its root runs {}", esc(program)));
    }
    if let Some(c) = &id.container_id {
        parts.push(format!("container {}", esc(c.get(..12).unwrap_or(c))));
    } else if let Some(pod) = &id.pod_uid {
        parts.push(format!("pod {}", esc(pod)));
    } else if let Some(unit) = &id.unit {
        parts.push(format!("unit {}", esc(unit)));
    }
    match parts.is_empty() {
        true => String::new(),
        false => format!("  [{}]", parts.join("; ")),
    }
}
