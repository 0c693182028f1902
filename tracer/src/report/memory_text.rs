//! The text report's "Memory the kernel counted" section: each process's
//! (and the traced cgroup's) resident, anonymous and file-backed memory at
//! the start, at its highest and at the end, how much of the anonymous
//! growth the traced heap accounts for, and what the rest is as far as the
//! kernel's numbers tell (model/explain.rs; docs/growth.md). The live page
//! shows the same lines (`explanation`).

use std::io::{self, Write};

use crate::escape::text as esc;

use super::Profile;
use crate::profile::{GrowthExplained, KernelMemory, MemorySample};

/// Processes given lines of their own, those whose memory grew most first.
const PROCESS_LINES: usize = 12;

/// Writes the section; nothing when no memory was read (a scope the
/// kernel's numbers are not read for, a file saved before they were).
pub(super) fn write_memory(p: &Profile, w: &mut impl Write) -> io::Result<()> {
    let mut processes: Vec<_> = p
        .processes
        .iter()
        .filter_map(|proc| Some((proc, proc.memory.as_ref()?)))
        .collect();
    if processes.is_empty() && p.cgroup_memory.is_none() {
        return Ok(());
    }
    writeln!(w)?;
    writeln!(
        w,
        "Memory the kernel counted, beside the traced heap (docs/growth.md):"
    )?;
    let sampled = !p.sampling().is_exact();
    if let Some(memory) = &p.cgroup_memory {
        writeln!(w, "  the cgroup ({}): {}", memory.source, readings(memory))?;
        for line in explanation(memory, None, sampled) {
            writeln!(w, "    {line}")?;
        }
    }
    processes.sort_by_key(|(_, m)| std::cmp::Reverse(m.end.resident_bytes));
    for (proc, memory) in processes.iter().take(PROCESS_LINES) {
        let label = p.process_label(proc.pid, proc.start_time);
        writeln!(w, "  {}: {}", esc(&label), readings(memory))?;
        for line in explanation(memory, Some(proc.pid), sampled) {
            writeln!(w, "    {line}")?;
        }
    }
    if processes.len() > PROCESS_LINES {
        writeln!(
            w,
            "  ... {} more (--format json lists them all)",
            super::counted(
                (processes.len() - PROCESS_LINES) as u64,
                "process",
                "processes"
            )
        )?;
    }
    Ok(())
}

/// "resident 3.1 MiB at the start, 67.2 MiB at its highest (9.8 s),
/// 67.2 MiB at the end (10.0 s)".
fn readings(m: &KernelMemory) -> String {
    let at = |s: &MemorySample| format!("{} ({:.1} s)", size(s.resident_bytes), s.secs);
    format!(
        "resident {} at the start, {} at its highest, {} at the end",
        at(&m.start),
        at(&m.peak),
        at(&m.end)
    )
}

/// What the growth was and what explains it, in lines; `pid` names the
/// process's own files in the advice.
pub fn explanation(m: &KernelMemory, pid: Option<u32>, sampled: bool) -> Vec<String> {
    let Some(g) = &m.growth else {
        return Vec::new();
    };
    let mut lines = vec![format!(
        "anonymous {} (resident or swapped), file-backed {}; the traced heap {}{}",
        signed(g.anon_growth_bytes),
        signed(g.file_growth_bytes),
        if sampled { "about " } else { "" },
        signed(g.heap_growth_bytes)
    )];
    match g.heap_share {
        None => lines.push(format!(
            "anonymous memory grew by less than {}: nothing to explain",
            size(crate::profile::MIN_GROWTH)
        )),
        Some(share) => lines.push(share_line(g, share)),
    }
    if g.allocator_retained_bytes >= crate::profile::MIN_GROWTH {
        lines.push(format!(
            "{} of it the heap held at its peak and freed by the end: memory the allocator may \
             keep (glibc gives it back with malloc_trim(0), sooner with MALLOC_TRIM_THRESHOLD_ \
             and fewer arenas with MALLOC_ARENA_MAX; jemalloc with a shorter dirty_decay_ms)",
            size(g.allocator_retained_bytes)
        ));
    }
    if g.other_anon_bytes >= crate::profile::MIN_GROWTH {
        let smaps = match pid {
            Some(pid) => format!("/proc/{pid}/smaps"),
            None => "the processes' /proc/PID/smaps".to_string(),
        };
        lines.push(format!(
            "{} is anonymous memory the hooked allocator did not hand out: mmap calls outside \
             malloc, thread stacks, JIT code, or an allocator that is not hooked; {smaps} shows \
             which mappings grew",
            size(g.other_anon_bytes)
        ));
    }
    if g.file_growth_bytes >= crate::profile::MIN_GROWTH as i64 {
        lines.push(format!(
            "file-backed memory grew by {}: mapped files, shared memory or page cache, not heap",
            size(g.file_growth_bytes.unsigned_abs())
        ));
    }
    lines
}

fn share_line(g: &GrowthExplained, share: f64) -> String {
    let pct = (share * 100.0).round();
    let verdict = if share >= 0.9 {
        "the heap explains the growth"
    } else if share >= 0.5 {
        "the heap explains most of the growth"
    } else {
        "the heap explains little of the growth"
    };
    format!(
        "{verdict}: it accounts for {pct:.0} % of the {} anonymous growth",
        size(g.anon_growth_bytes.unsigned_abs())
    )
}

fn size(bytes: u64) -> String {
    super::human_bytes(bytes)
}

/// "+64.0 MiB", "-3.0 KiB", "+0 B".
fn signed(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    format!("{sign}{}", size(bytes.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::explain::{explain, HeapWindow};

    const MIB: u64 = 1 << 20;

    fn memory(anon_start: u64, anon_end: u64, heap: HeapWindow) -> KernelMemory {
        let at = |secs, anon| MemorySample {
            secs,
            resident_bytes: anon + 2 * MIB,
            anon_bytes: anon,
            file_bytes: 2 * MIB,
            swap_bytes: 0,
        };
        let (start, end) = (at(0.0, anon_start), at(10.0, anon_end));
        KernelMemory {
            source: "status".into(),
            start,
            peak: end,
            end,
            readings: 11,
            growth: Some(explain(&start, &end, heap)),
        }
    }

    #[test]
    fn mmap_growth_is_said_to_be_outside_the_heap_with_where_to_look() {
        let m = memory(MIB, 65 * MIB, HeapWindow::default());
        let lines = explanation(&m, Some(42), false).join("\n");
        assert!(
            lines.contains(
                "the heap explains little of the growth: it accounts for 0 % of the 64.0 MiB"
            ),
            "{lines}"
        );
        assert!(
            lines.contains("64.0 MiB is anonymous memory the hooked allocator did not hand out"),
            "{lines}"
        );
        assert!(lines.contains("/proc/42/smaps"), "{lines}");
        assert!(!lines.contains("allocator may keep"), "{lines}");
        assert!(
            readings(&m).starts_with("resident 3.0 MiB (0.0 s) at the start"),
            "{}",
            readings(&m)
        );
    }

    #[test]
    fn a_leak_is_explained_and_retention_is_said_with_what_to_try() {
        let heap = HeapWindow {
            growth: 30 * MIB as i64,
            peak: 40 * MIB,
            end: 30 * MIB,
        };
        let lines = explanation(&memory(MIB, 41 * MIB, heap), None, true).join("\n");
        assert!(lines.contains("the traced heap about +30.0 MiB"), "{lines}");
        assert!(
            lines.contains("explains most of the growth: it accounts for 75 %"),
            "{lines}"
        );
        assert!(
            lines.contains("10.0 MiB of it the heap held at its peak"),
            "{lines}"
        );
        assert!(lines.contains("malloc_trim(0)"), "{lines}");
        let none = explanation(&memory(MIB, MIB, HeapWindow::default()), None, false);
        assert!(none[1].contains("nothing to explain"), "{none:?}");
    }
}
