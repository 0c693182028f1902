//! The heap model and the sampling weights: pure, no BPF, no I/O.

pub mod explain;
pub mod heap;
pub mod history;
pub mod peak;
pub mod peak_trigger;
pub mod sampling;
pub mod temporary;
pub mod trend;
