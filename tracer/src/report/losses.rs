//! The loss counters: one table says, for each, where the BPF programs count
//! it, its name in the report and the JSON, what it means, and which flag
//! raises the limit behind it. Reading the counters and printing them both
//! walk that table.

use std::io::{self, Write};

use tracer_common::counter;

use crate::profile::Losses;

/// One loss counter of the BPF programs, as the report knows it.
#[derive(Clone, Copy, Debug)]
pub struct LossCounter {
    /// Its slot in the COUNTERS map (`tracer_common::counter`).
    pub index: u32,
    /// Field name in `Losses` (and in the JSON output).
    pub name: &'static str,
    pub meaning: &'static str,
    /// True when a non-zero count means data is missing from the report.
    pub is_loss: bool,
    /// The flag that raises the limit behind it, or the usual cause when
    /// no flag helps; for real losses only.
    pub remedy: Option<&'static str>,
    get: fn(&Losses) -> u64,
    set: fn(&mut Losses, u64),
}

/// A table row; the field name is written once and read and written
/// through `get` / `set`, so a row cannot point at the wrong field.
macro_rules! row {
    ($field:ident, $index:expr, $meaning:expr, is_loss: $is_loss:expr, remedy: $remedy:expr) => {
        LossCounter {
            index: $index,
            name: stringify!($field),
            meaning: $meaning,
            is_loss: $is_loss,
            remedy: $remedy,
            get: |l| l.$field,
            set: |l, v| l.$field = v,
        }
    };
}

/// Every loss counter, in the order reports print them.
pub const COUNTERS: [LossCounter; 12] = [
    row!(ringbuf_full, counter::RINGBUF_FULL,
        "events dropped because the ring buffer was full",
        is_loss: true, remedy: Some("raise --ringbuf-mb")),
    row!(live_map_full, counter::LIVE_MAP_FULL,
        "allocations not tracked because the live map was full",
        is_loss: true, remedy: Some("raise --max-live")),
    row!(stack_lost, counter::STACK_LOST,
        "allocations recorded without a call stack",
        is_loss: true, remedy: Some("raise --stack-storage-size")),
    row!(inflight_full, counter::INFLIGHT_FULL,
        "allocator calls whose entry could not be remembered",
        is_loss: true, remedy: Some("cause: many threads inside the allocator at once")),
    row!(read_failed, counter::READ_FAILED,
        "posix_memalign results that could not be read",
        is_loss: true, remedy: None),
    row!(stale_inflight, counter::STALE_INFLIGHT,
        "allocator calls whose return was never seen",
        is_loss: true, remedy: Some("cause: threads that died inside the allocator")),
    row!(nested_lost, counter::NESTED_LOST,
        "allocator calls of signal handlers nested too deep in interrupted allocator calls",
        is_loss: true, remedy: Some("cause: signal handlers interrupting each other's allocations")),
    row!(frees_dropped, counter::FREE_DROPPED,
        "of ringbuf_full, frees: their blocks still count as in use (in-use overstated)",
        is_loss: false, remedy: None),
    row!(frees_of_dropped_allocs, counter::FREE_OF_DROPPED_ALLOC,
        "frees of blocks whose allocation event was dropped (see ringbuf_full; not unknown)",
        is_loss: false, remedy: None),
    row!(unknown_frees, counter::UNKNOWN_FREE,
        "frees of blocks the trace never saw allocated (not a loss; see notes)",
        is_loss: false, remedy: None),
    row!(unknown_free_bytes, counter::UNKNOWN_FREE_BYTES,
        "bytes those frees handed back (glibc's chunk sizes, exact mode; 0 where unknown)",
        is_loss: false, remedy: None),
    row!(return_without_entry, counter::RETURN_WITHOUT_ENTRY,
        "returns of calls begun while probes were being attached (not a loss)",
        is_loss: false, remedy: None),
];

/// One loss counter with its count, for report footers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossLine {
    /// Field name in `Losses` (and in the JSON output).
    pub name: &'static str,
    pub count: u64,
    pub meaning: &'static str,
    /// True when a non-zero count means data is missing from the report.
    pub is_loss: bool,
    /// How to avoid the loss next time, for real losses.
    pub remedy: Option<&'static str>,
}

impl Losses {
    /// Every counter of the table, read by its index with `read`.
    pub fn read(read: impl Fn(u32) -> u64) -> Losses {
        let mut losses = Losses::default();
        for c in &COUNTERS {
            (c.set)(&mut losses, read(c.index));
        }
        losses
    }

    /// Every counter, in the table's order, with its explanation.
    pub fn lines(&self) -> [LossLine; COUNTERS.len()] {
        COUNTERS.map(|c| LossLine {
            name: c.name,
            count: (c.get)(self),
            meaning: c.meaning,
            is_loss: c.is_loss,
            remedy: c.remedy,
        })
    }

    /// The counters that mean missing data and are not zero, as
    /// `name count` words for a one-line summary (empty: nothing lost).
    pub fn lost_words(&self) -> String {
        self.lines()
            .iter()
            .filter(|l| l.is_loss && l.count > 0)
            .map(|l| format!("{} {}", l.name, l.count))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Sum of the counters that mean missing data.
    pub fn lost(&self) -> u64 {
        self.lines()
            .iter()
            .filter(|l| l.is_loss)
            .fold(0, |sum, l| sum.saturating_add(l.count))
    }
}

/// Every counter, zero or not, so a clean run is visibly clean (memleak
/// prints its drops the same way). Public for formats that have no room for
/// them (collapsed, flamegraph): the caller prints them to stderr.
pub fn write_losses(losses: &Losses, w: &mut impl Write) -> io::Result<()> {
    writeln!(w, "Losses:")?;
    let lines = losses.lines();
    let name_width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    let count_width = lines
        .iter()
        .map(|l| l.count.to_string().len())
        .max()
        .unwrap_or(1);
    for l in &lines {
        let remedy = match l.remedy {
            Some(remedy) if l.is_loss && l.count > 0 => format!(" ({remedy})"),
            _ => String::new(),
        };
        writeln!(
            w,
            "  {:<name_width$}  {:>count_width$}  {}{remedy}",
            l.name, l.count, l.meaning
        )?;
    }
    match losses.lost() {
        0 => writeln!(w, "no events lost")?,
        n => writeln!(
            w,
            "WARNING: {} lost: the numbers above are incomplete",
            super::counted(n, "event", "events")
        )?,
    }
    if losses.ringbuf_full > 0 {
        let frees = match losses.frees_dropped {
            1 => "1 of the events dropped was a free, whose block still counts".to_string(),
            n => format!("{n} of the events dropped were frees, whose blocks still count"),
        };
        writeln!(w, "WARNING: in-use may be overstated: {frees} as in use")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_json_field_once_and_every_loss_index_once() {
        let json = serde_json::to_value(Losses::default()).expect("serializes");
        let fields: Vec<&str> = json
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        let mut names: Vec<&str> = COUNTERS.iter().map(|c| c.name).collect();
        names.sort_unstable();
        let mut sorted_fields = fields.clone();
        sorted_fields.sort_unstable();
        assert_eq!(names, sorted_fields);

        let mut indices: Vec<u32> = COUNTERS.iter().map(|c| c.index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), COUNTERS.len(), "an index used twice");
        // The two fork counters are read by forks.rs, the unwind ones by
        // collect/unwind_notes.rs, the return runs by probes/counters.rs:
        // not losses.
        for i in 0..counter::COUNT {
            let forks = i == counter::CHILD_NOT_TRACED || i == counter::CHILD_NOT_FOLLOWED;
            let unwind = (counter::UNWIND_TRUNCATED..=counter::UNWIND_RESUMED).contains(&i);
            let returns = i == counter::RETURN_RUNS || i == counter::RETURN_RUNS_UNTRACED;
            assert_eq!(
                indices.contains(&i),
                !forks && !unwind && !returns,
                "counter {i}"
            );
        }
    }

    #[test]
    fn each_counter_lands_in_its_own_field_and_only_losses_count_as_lost() {
        // Counter i reads as 1 << i: every field holds a different bit.
        let losses = Losses::read(|i| 1 << i);
        assert_eq!(losses.ringbuf_full, 1 << counter::RINGBUF_FULL);
        assert_eq!(losses.live_map_full, 1 << counter::LIVE_MAP_FULL);
        assert_eq!(losses.stack_lost, 1 << counter::STACK_LOST);
        assert_eq!(losses.unknown_frees, 1 << counter::UNKNOWN_FREE);
        assert_eq!(losses.unknown_free_bytes, 1 << counter::UNKNOWN_FREE_BYTES);
        assert_eq!(
            losses.return_without_entry,
            1 << counter::RETURN_WITHOUT_ENTRY
        );
        assert_eq!(losses.inflight_full, 1 << counter::INFLIGHT_FULL);
        assert_eq!(losses.read_failed, 1 << counter::READ_FAILED);
        assert_eq!(losses.stale_inflight, 1 << counter::STALE_INFLIGHT);
        assert_eq!(losses.nested_lost, 1 << counter::NESTED_LOST);
        assert_eq!(losses.frees_dropped, 1 << counter::FREE_DROPPED);
        assert_eq!(
            losses.frees_of_dropped_allocs,
            1 << counter::FREE_OF_DROPPED_ALLOC
        );
        let lost: u64 = [
            counter::RINGBUF_FULL,
            counter::LIVE_MAP_FULL,
            counter::STACK_LOST,
            counter::INFLIGHT_FULL,
            counter::READ_FAILED,
            counter::STALE_INFLIGHT,
            counter::NESTED_LOST,
        ]
        .iter()
        .map(|i| 1 << i)
        .sum();
        assert_eq!(losses.lost(), lost);
    }
}
