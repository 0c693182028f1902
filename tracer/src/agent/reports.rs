//! Where triggered traces' reports go: one JSON per trace (and the other
//! formats its trigger asks for) in the reports directory, named after
//! when, what and why: `20261129T041500Z-cgroup-system.slice-x.service-
//! memory-above.json`. Bounded: past `max` reports the oldest are removed
//! first (each with its other formats), and counted.

use std::{
    fs,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::Context as _;

use super::triggers::Trigger;
use crate::report::{Format, RenderOptions, Sort, View};

pub struct Reports {
    dir: PathBuf,
    max: usize,
    /// Reports removed to stay within `max`, since the agent started.
    pub removed: u64,
}

impl Reports {
    pub fn new(dir: PathBuf, max: usize) -> Reports {
        Reports {
            dir,
            max,
            removed: 0,
        }
    }

    /// Saves the final profile at `profile` for `trigger`; the JSON
    /// report's file name.
    pub fn save(&mut self, profile: &Path, trigger: &Trigger) -> anyhow::Result<String> {
        let stem = format!("{}-{}", utc_stamp(SystemTime::now()), trigger.slug());
        let json = self.dir.join(format!("{stem}.json"));
        fs::copy(profile, &json).with_context(|| format!("writing {}", json.display()))?;
        if !trigger.formats.is_empty() {
            let mut loaded = crate::saved::load(profile)?;
            loaded.sort_stacks(Sort::Inuse);
            for &format in &trigger.formats {
                let path = self.dir.join(format!("{stem}.{}", extension(format)));
                let options = RenderOptions {
                    format,
                    view: View::InuseSpace,
                    top: 20,
                    sort: Sort::Inuse,
                };
                let mut out = Vec::new();
                crate::report::render(&loaded, &options, &mut out)?;
                fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
            }
        }
        self.prune();
        Ok(format!("{stem}.json"))
    }

    /// Removes the oldest reports beyond `max` (names sort by time).
    fn prune(&mut self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut stems: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".json").map(str::to_string))
            .filter(|n| n.len() > 17 && n.as_bytes()[15] == b'Z')
            .collect();
        stems.sort();
        let excess = stems.len().saturating_sub(self.max);
        for stem in stems.into_iter().take(excess) {
            let Ok(entries) = fs::read_dir(&self.dir) else {
                return;
            };
            for e in entries.filter_map(Result::ok) {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if name
                    .strip_prefix(stem.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
                {
                    let _ = fs::remove_file(e.path());
                }
            }
            self.removed += 1;
            crate::console::say(format_args!(
                "reports: {} removed (more than {} kept)",
                crate::escape::text(&stem),
                self.max
            ));
        }
    }
}

fn extension(format: Format) -> &'static str {
    match format {
        Format::Pprof => "pb.gz",
        Format::Flamegraph => "svg",
        Format::Collapsed => "folded",
        Format::Speedscope => "speedscope.json",
        Format::Json => "json",
        _ => "txt",
    }
}

/// `20261129T041500Z`.
pub fn utc_stamp(at: SystemTime) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days as i64);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) (the proleptic Gregorian
/// calendar; Howard Hinnant's days_from_civil, inverted).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamps_are_utc_and_sort_by_time() {
        let at = |s: u64| utc_stamp(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "19700101T000000Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
        assert_eq!(at(1_795_925_235), "20261129T040715Z");
        assert!(at(1_795_925_235) < at(1_795_925_236));
    }

    #[test]
    fn past_the_bound_the_oldest_reports_go_with_their_formats() {
        let dir = std::env::temp_dir().join(format!("memtrace-reports-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for stem in [
            "20260101T000000Z-a",
            "20260102T000000Z-b",
            "20260103T000000Z-c",
        ] {
            fs::write(dir.join(format!("{stem}.json")), "{}").unwrap();
            fs::write(dir.join(format!("{stem}.txt")), "").unwrap();
        }
        fs::write(dir.join("notes.json"), "{}").unwrap();
        let mut reports = Reports::new(dir.clone(), 2);
        reports.prune();
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "20260102T000000Z-b.json",
                "20260102T000000Z-b.txt",
                "20260103T000000Z-c.json",
                "20260103T000000Z-c.txt",
                "notes.json"
            ]
        );
        assert_eq!(reports.removed, 1);
        let _ = fs::remove_dir_all(&dir);
    }
}
