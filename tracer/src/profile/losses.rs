//! The loss counters of a report: one count per row of
//! `tracer_common::counter::TABLE`, which says what each is. The JSON
//! `losses` object is written and read from that table too: its keys are
//! the names of the counters the report shows, in table order.

use std::fmt;

use serde::{
    de::{IgnoredAny, MapAccess, Visitor},
    ser::SerializeMap,
    Deserialize, Deserializer, Serialize, Serializer,
};
use tracer_common::counter::{self, TABLE};

/// Every way the tracer failed to record something, counted, by counter
/// index (`tracer_common::counter`). Only the counters the report shows
/// are kept (`Counter::reported`); the others stay 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Losses {
    counts: [u64; counter::COUNT as usize],
}

impl Default for Losses {
    fn default() -> Losses {
        Losses {
            counts: [0; counter::COUNT as usize],
        }
    }
}

impl Losses {
    /// The count of counter `index` (0 for an index out of the table).
    pub fn get(&self, index: u32) -> u64 {
        self.counts.get(index as usize).copied().unwrap_or(0)
    }

    /// Sets counter `index` (ignored for an index out of the table or a
    /// counter the report does not show).
    pub fn set(&mut self, index: u32, count: u64) {
        if reported(index) {
            if let Some(c) = self.counts.get_mut(index as usize) {
                *c = count;
            }
        }
    }

    /// Adds to counter `index`, saturating.
    pub fn add(&mut self, index: u32, count: u64) {
        self.set(index, self.get(index).saturating_add(count));
    }

    /// With counter `index` set to `count`.
    #[must_use]
    pub fn with(mut self, index: u32, count: u64) -> Losses {
        self.set(index, count);
        self
    }
}

fn reported(index: u32) -> bool {
    TABLE.iter().any(|c| c.index == index && c.reported())
}

impl Serialize for Losses {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(counter::REPORTED))?;
        for c in TABLE.iter().filter(|c| c.reported()) {
            m.serialize_entry(c.name, &self.get(c.index))?;
        }
        m.end()
    }
}

/// Reads what `Serialize` writes: a key missing is 0, a key of no counter
/// shown (a newer or older tracer's) is skipped.
impl<'de> Deserialize<'de> for Losses {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Losses, D::Error> {
        struct LossesVisitor;
        impl<'de> Visitor<'de> for LossesVisitor {
            type Value = Losses;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of loss counters")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Losses, A::Error> {
                let mut losses = Losses::default();
                while let Some(key) = map.next_key::<String>()? {
                    match TABLE.iter().find(|c| c.reported() && c.name == key) {
                        Some(c) => losses.set(c.index, map.next_value()?),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(losses)
            }
        }
        d.deserialize_map(LossesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::counter::{Class, INFLIGHT_FULL, RETURN_RUNS, UNKNOWN_FREE_BYTES};

    #[test]
    fn the_json_object_has_every_counter_shown_in_table_order_and_reads_back() {
        let mut losses = Losses::default();
        for (i, c) in TABLE.iter().enumerate() {
            losses.set(c.index, i as u64 + 1);
        }
        let json = serde_json::to_string(&losses).expect("serializes");
        let shown: Vec<String> = TABLE
            .iter()
            .enumerate()
            .filter(|(_, c)| c.class != Class::Other)
            .map(|(i, c)| format!("\"{}\":{}", c.name, i + 1))
            .collect();
        assert_eq!(json, format!("{{{}}}", shown.join(",")));
        let back: Losses = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back, losses);
    }

    #[test]
    fn missing_keys_read_as_zero_and_unknown_ones_are_skipped() {
        let back: Losses = serde_json::from_str(
            r#"{"inflight_full": 4, "from_a_newer_tracer": [1], "return_runs": 9}"#,
        )
        .expect("reads");
        assert_eq!(back, Losses::default().with(INFLIGHT_FULL, 4));
        assert!(serde_json::from_str::<Losses>(r#"{"inflight_full": -1}"#).is_err());
    }

    #[test]
    fn counters_the_report_does_not_show_stay_zero() {
        let mut l = Losses::default();
        l.add(RETURN_RUNS, 5);
        l.add(u32::MAX, 5);
        l.add(UNKNOWN_FREE_BYTES, u64::MAX);
        l.add(UNKNOWN_FREE_BYTES, 1);
        assert_eq!(l.get(RETURN_RUNS), 0);
        assert_eq!(l.get(UNKNOWN_FREE_BYTES), u64::MAX, "saturates");
    }
}
