//! The files of the agent's traces in its directory: each trace's
//! numbered JSON snapshots (`ID-N.json`, the newest kept) and its log
//! (`ID.stderr`), and the standby tracer's log (`standby-N.stderr`).

use std::{
    fs,
    io::Read as _,
    path::{Path, PathBuf},
};

/// `ID-N.json` with the highest N.
pub(super) fn newest_snapshot(dir: &Path, id: u64) -> Option<(u64, PathBuf)> {
    snapshots(dir, id).into_iter().max_by_key(|(n, _)| *n)
}

fn snapshots(dir: &Path, id: u64) -> Vec<(u64, PathBuf)> {
    let prefix = format!("{id}-");
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(&prefix)?.strip_suffix(".json")?;
            Some((n.parse::<u64>().ok()?, e.path()))
        })
        .collect()
}

/// Every snapshot of trace `id` but the newest.
pub(super) fn prune_snapshots(dir: &Path, id: u64) {
    let mut all = snapshots(dir, id);
    all.sort_by_key(|(n, _)| *n);
    all.pop();
    for (_, path) in all {
        let _ = fs::remove_file(path);
    }
}

/// Every `ID-N.json` and `ID.stderr` in `dir`.
pub(super) fn remove_left_over(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let numbered = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let ours = match (name.strip_suffix(".json"), name.strip_suffix(".stderr")) {
            (_, Some(stem)) if stem.strip_prefix("standby-").is_some_and(numbered) => true,
            (Some(stem), _) => stem
                .split_once('-')
                .is_some_and(|(a, b)| numbered(a) && numbered(b)),
            (_, Some(stem)) => numbered(stem),
            _ => false,
        };
        if ours {
            let _ = fs::remove_file(e.path());
        }
    }
}

pub(super) fn remove_files(dir: &Path, id: u64) {
    for (_, path) in snapshots(dir, id) {
        let _ = fs::remove_file(path);
    }
    let _ = fs::remove_file(dir.join(format!("{id}.stderr")));
}

/// The tracer's stderr has its "tracing ..." line (within its first 8 KiB).
pub(super) fn said_tracing(path: &Path) -> bool {
    let mut head = Vec::new();
    let read = fs::File::open(path).and_then(|f| f.take(8192).read_to_end(&mut head));
    read.is_ok()
        && head
            .split(|&b| b == b'\n')
            .any(|l| l.starts_with(b"memtrace-bpf: tracing "))
}

#[cfg(test)]
mod tests {
    use super::{super::log_tail::tail_of, *};

    #[test]
    fn only_the_newest_snapshot_is_kept_and_found() {
        let dir = std::env::temp_dir().join(format!("memtrace-jobs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for name in ["3-1.json", "3-2.json", "3-10.json", "31-1.json", "3-x.json"] {
            fs::write(dir.join(name), "{}").unwrap();
        }
        assert_eq!(newest_snapshot(&dir, 3).map(|s| s.0), Some(10));
        prune_snapshots(&dir, 3);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["3-10.json", "3-x.json", "31-1.json"]);
        fs::write(
            dir.join("3.stderr"),
            "memtrace-bpf: tracing\nmemtrace-bpf: error: no \u{1b}[2J\n",
        )
        .unwrap();
        assert_eq!(tail_of(&dir.join("3.stderr")), "no \\x1b[2J");
        remove_files(&dir, 3);
        assert!(newest_snapshot(&dir, 3).is_none());
        // A new agent starts with none of an earlier one's files.
        fs::write(dir.join("1.stderr"), "").unwrap();
        fs::write(dir.join("standby-2.stderr"), "").unwrap();
        fs::write(dir.join("standby-x.stderr"), "").unwrap();
        fs::write(dir.join("notes.txt"), "").unwrap();
        remove_left_over(&dir);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["3-x.json", "notes.txt", "standby-x.stderr"]);
        let _ = fs::remove_dir_all(&dir);
    }
}
