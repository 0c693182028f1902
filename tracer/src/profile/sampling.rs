//! What a trace records: every allocation, or a sample of them.

/// What is recorded: every allocation, or about one per `n` bytes
/// allocated (`--sample-rate`; 1 means exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampling {
    Exact,
    /// The mean interval in bytes, above 1.
    Bytes(u64),
}

impl Sampling {
    /// From `--sample-rate` (or a saved profile's `sample_rate`): 0 and 1
    /// are exact.
    pub fn from_rate(rate: u64) -> Sampling {
        match rate {
            0 | 1 => Sampling::Exact,
            n => Sampling::Bytes(n),
        }
    }

    /// The mean interval in bytes, 1 when exact (as the BPF side and the
    /// reports take it).
    pub fn rate(self) -> u64 {
        match self {
            Sampling::Exact => 1,
            Sampling::Bytes(n) => n,
        }
    }

    pub fn is_exact(self) -> bool {
        self == Sampling::Exact
    }
}
