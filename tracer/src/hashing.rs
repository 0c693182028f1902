//! The hash maps on the event path: every event of a trace looks up its
//! process, its block and its stack, so the hasher is a large part of the
//! tracer's own CPU (std's SipHash was 40 % of it in exact mode).
//!
//! foldhash is several times faster on the integer and short-slice keys
//! used here. Its `RandomState` draws a random seed for every map, so a
//! traced process, which chooses the addresses it allocates and frees,
//! cannot precompute keys that collide in the tracer's tables.

/// A `HashMap` with foldhash's randomly seeded hasher; build it with
/// `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `HashSet` with foldhash's randomly seeded hasher.
pub type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
