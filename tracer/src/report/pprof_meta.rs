//! The pprof profile's surroundings: its comments, times, the build ids
//! of its mappings, and its string table.

use std::collections::HashMap;
use std::path::Path;

use super::{Note, Profile};
use crate::escape;

/// What the text report says around its table: what was traced, for how
/// long, how, why it ended, and every count of missing data.
pub(super) fn comments(p: &Profile) -> Vec<String> {
    let mut c = vec![
        format!("memtrace-bpf heap profile of {}", p.target),
        format!(
            "duration: {:.3} s; ended: {}",
            p.duration_secs, p.end_reason
        ),
        format!(
            "sample rate: {} bytes: {}",
            p.sample_rate.max(1),
            p.sampling_description()
        ),
        format!("stacks: {}", p.unwind),
    ];
    c.extend(p.min_age_description().map(|d| format!("min age: {d}")));
    for l in p.losses.lines().iter().filter(|l| l.count > 0) {
        let mut line = format!("{}: {} {}", l.name, l.count, l.meaning);
        if let Some(remedy) = l.remedy {
            line.push_str(&format!(" ({remedy})"));
        }
        c.push(line);
    }
    let exit = &p.not_freed_at_exit;
    if exit.bytes > 0 || exit.objects > 0 {
        c.push(format!(
            "not freed at exit by {} exited processes (not in the samples): {} bytes in {} blocks",
            exit.processes, exit.bytes, exit.objects
        ));
    }
    for proc in &p.processes {
        if let Some(kill) = proc.oom_killed {
            c.push(format!(
                "OOM kill: pid {} ({}) at {:.3} s, holding {} bytes in {} objects (in the samples)",
                proc.pid, proc.program, kill.secs, kill.inuse_bytes, kill.inuse_objects
            ));
        }
    }
    if let Some(t) = p.temporary.filter(|t| t.objects > 0) {
        c.push(format!(
            "temporary allocations (freed by their thread before its next allocation): {} ({} bytes)",
            t.objects, t.bytes
        ));
    }
    c.extend(growth_comments(p));
    c.extend(memory_comments(p));
    c.extend(p.notes.iter().map(Note::to_string));
    c
}

/// The kernel's memory numbers beside the heap (text's "Memory the
/// kernel counted"), for the cgroup and at most 12 processes.
fn memory_comments(p: &Profile) -> Vec<String> {
    let sampled = !p.sampling().is_exact();
    let cgroup = p
        .cgroup_memory
        .iter()
        .map(|m| ("the cgroup".to_string(), m, None));
    let processes = p.processes.iter().filter_map(|proc| {
        let label = escape::text(&p.process_label(proc.pid, proc.start_time)).into_owned();
        Some((label, proc.memory.as_ref()?, Some(proc.pid)))
    });
    cgroup
        .chain(processes)
        .take(13)
        .flat_map(|(label, m, pid)| {
            let explained = super::memory_text::explanation(m, pid, sampled);
            explained
                .into_iter()
                .map(move |line| format!("memory of {label}: {line}"))
        })
        .collect()
}

/// Stacks listed by growth in the comments.
const GROWING_COMMENTS: usize = 5;

/// The history's span and the fastest growing stacks, leaf first.
fn growth_comments(p: &Profile) -> Vec<String> {
    let (Some(first), Some(last)) = (p.snapshots.first(), p.snapshots.last()) else {
        return Vec::new();
    };
    let mut c = vec![format!(
        "history: {} snapshots from {:.1} s to {:.1} s",
        p.snapshots.len(),
        first.secs,
        last.secs
    )];
    let mut growing: Vec<_> = p
        .stacks
        .iter()
        .filter_map(|s| Some((s.growth_bytes_per_sec.filter(|&g| g > 0.0)?, s)))
        .collect();
    growing.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (i, (rate, s)) in growing.iter().take(GROWING_COMMENTS).enumerate() {
        let frames: Vec<&str> = s
            .frames
            .iter()
            .take(4)
            .map(|f| f.function.as_str())
            .collect();
        c.push(format!(
            "growth #{}: {} ({}) pid {}: {}",
            i + 1,
            super::rate_per_min(*rate),
            s.trend.map_or("unclassified", |t| t.name()),
            s.pid,
            frames.join(" < ")
        ));
    }
    c
}

pub(super) fn duration_nanos(secs: f64) -> i64 {
    // `as` saturates for floats; NaN becomes 0.
    (secs * 1e9) as i64
}

/// When a trace began, for a profile that does not say: now less its
/// duration.
pub(super) fn start_nanos(duration_nanos: i64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    now.saturating_sub(duration_nanos)
}

pub(super) fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The GNU build id of `frame`'s object, in hex, as pprof and `file` show
/// it: the one the frame carries, else (older saved files) read from the
/// file if it is still there; "" when neither has one.
pub(super) fn frame_build_id(frame: &super::Frame, module: &str) -> String {
    match &frame.build_id {
        Some(id) => id.to_string(),
        None => build_id(Path::new(module)),
    }
}

/// The GNU build id of the object at `path`, in hex; "" when it cannot be
/// read (deleted, not ELF, no note). Only the headers and the note are
/// read, not the whole object.
fn build_id(path: &Path) -> String {
    let Ok(file) = open_regular(path) else {
        return String::new();
    };
    let cache = object::ReadCache::new(file);
    let Ok(obj) = object::File::parse(&cache) else {
        return String::new();
    };
    use object::Object as _;
    match obj.build_id() {
        Ok(Some(id)) => id.iter().map(|b| format!("{b:02x}")).collect(),
        _ => String::new(),
    }
}

/// Opens a regular file without blocking: the path names an object a traced
/// process mapped, which its owner controls (a FIFO would block us).
pub(super) fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// pprof's string table: index 0 is "", every string once. Strings are
/// escaped as the text report escapes them (see the module documentation).
pub(super) struct Strings {
    pub(super) table: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Default for Strings {
    fn default() -> Strings {
        Strings {
            table: vec![String::new()],
            ids: HashMap::from([(String::new(), 0)]),
        }
    }
}

impl Strings {
    pub(super) fn id(&mut self, s: &str) -> i64 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.table.len() as i64;
        self.table.push(escape::text(s).into_owned());
        self.ids.insert(s.to_owned(), id);
        id
    }
}
