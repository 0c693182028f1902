//! The bounds of what the command line, saved files and HTTP queries may
//! ask for: one place, on the ground floor, that every layer reads.

/// Longest `--duration`: a year. Longer is surely a typo, and far longer
/// makes `Duration::from_secs_f64` and the timer's deadline overflow.
pub const MAX_DURATION_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Shortest `--interval`: with `{n}`, a snapshot symbolizes and writes a
/// whole report.
pub const MIN_INTERVAL_SECS: f64 = 0.1;

/// What `-o` replaces with a snapshot's number under `--interval`.
pub const SNAPSHOT_NUMBER: &str = "{n}";

/// Largest `--sample-rate`: 1 TiB between samples. The BPF side multiplies
/// it by a table entry below 2^20 in 64 bits; anything larger would wrap.
pub const MAX_SAMPLE_RATE: u64 = 1 << 40;

/// Largest `--max-live`: the kernel reserves 16 bytes of hash buckets per
/// entry up front (1 GiB at this size) and refuses more than 2^31.
pub const MAX_LIVE: u32 = 1 << 26;

/// Largest `--stack-storage-size`: the kernel preallocates about 1 KiB per
/// frame-pointer stack (256 MiB at this size).
pub const MAX_STACK_STORAGE: u32 = 1 << 18;

/// Most snapshots --snapshot-on-peak writes in one trace: a heap that
/// keeps growing for days must not fill the disk (the report says how many
/// new highs were not written).
pub const MAX_PEAK_SNAPSHOTS: u32 = 64;
