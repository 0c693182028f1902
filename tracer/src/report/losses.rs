//! The loss counters in report footers: `tracer_common::counter::TABLE`
//! says, for each, where the BPF programs count it, its name in the report
//! and the JSON, what it means, and which flag raises the limit behind it.
//! Reading the counters and printing them both walk that table.

use std::io::{self, Write};

use tracer_common::counter::{self, Class, Counter, REPORTED, TABLE};

use crate::profile::Losses;

/// The counters the report shows, in the order it prints them: class by
/// class (losses, details, information), in table order within each.
pub const PRINTED: [Counter; REPORTED] = {
    let mut out = [TABLE[0]; REPORTED];
    let mut n = 0;
    let classes = [Class::Loss, Class::Detail, Class::Info];
    let mut k = 0;
    while k < classes.len() {
        let mut i = 0;
        while i < TABLE.len() {
            if TABLE[i].class as u8 == classes[k] as u8 {
                out[n] = TABLE[i];
                n += 1;
            }
            i += 1;
        }
        k += 1;
    }
    assert!(
        n == REPORTED,
        "a counter the report shows has no print class"
    );
    out
};

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
    /// Every counter the report shows, read by its index with `read`.
    pub fn read(read: impl Fn(u32) -> u64) -> Losses {
        PRINTED
            .iter()
            .fold(Losses::default(), |l, c| l.with(c.index, read(c.index)))
    }

    /// Every counter the report shows, in print order, with its
    /// explanation.
    pub fn lines(&self) -> [LossLine; REPORTED] {
        PRINTED.map(|c| LossLine {
            name: c.name,
            count: self.get(c.index),
            meaning: c.meaning,
            is_loss: c.class == Class::Loss,
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
    if losses.get(counter::RINGBUF_FULL) > 0 {
        let frees = match losses.get(counter::FREE_DROPPED) {
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
    fn every_counter_shown_is_printed_once_losses_first() {
        for c in TABLE.iter().filter(|c| c.reported()) {
            assert_eq!(
                PRINTED.iter().filter(|p| p.index == c.index).count(),
                1,
                "{}",
                c.name
            );
        }
        let classes: Vec<Class> = PRINTED.iter().map(|c| c.class).collect();
        assert!(classes.is_sorted(), "{classes:?}");
    }

    #[test]
    fn the_docs_list_every_counter_shown_in_print_order() {
        let doc = include_str!("../../../docs/formats.md");
        let start = doc
            .find("| counter | a loss? | counts |")
            .expect("the losses table");
        // (name, whether its "a loss?" column says yes)
        let rows: Vec<(&str, bool)> = doc[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .map(|l| {
                let mut cols = l.split('|').map(str::trim);
                let name = cols.nth(1).unwrap_or_default().trim_matches('`');
                (name, cols.next().is_some_and(|c| c.starts_with("yes")))
            })
            .collect();
        let printed: Vec<(&str, bool)> = PRINTED
            .iter()
            .map(|c| (c.name, c.class == Class::Loss))
            .collect();
        assert_eq!(rows, printed, "docs/formats.md's losses table");
    }

    #[test]
    fn each_counter_lands_in_its_own_line_and_only_losses_count_as_lost() {
        // Counter i reads as 1 << i: every line holds a different bit.
        let losses = Losses::read(|i| 1 << i);
        for l in losses.lines() {
            let c = TABLE
                .iter()
                .find(|c| c.name == l.name)
                .expect("in the table");
            assert_eq!(l.count, 1 << c.index, "{}", l.name);
        }
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
        assert_eq!(losses.get(counter::RETURN_RUNS), 0, "not shown, not read");
    }
}
