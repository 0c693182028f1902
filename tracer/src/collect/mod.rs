//! From the ring buffer to a `report::Profile`: the reader thread, the
//! collector that turns events into heap-model updates and interned stacks,
//! the table of processes seen, and the profile built from them.

pub mod collector;
pub mod processes;
pub mod profile;
pub mod reader;
pub mod stacks;
pub mod unwind_notes;
