//! From the ring buffer to a `report::Profile`: the reader thread, the
//! collector that turns events into heap-model updates and interned stacks,
//! the table of processes seen, and the profile built from them.

mod changes;
pub mod collector;
mod event_notes;
mod growth_explained;
mod merge;
mod meta;
pub mod oom;
mod oom_notes;
mod peaks;
pub mod processes;
pub mod profile;
mod profile_notes;
pub mod reader;
mod ring;
mod roots;
mod stack_table;
pub mod stacks;
mod state;
mod timeline;
pub mod unwind_notes;

pub use changes::{Exec, ProcessChange};
pub use meta::InUseFilter;
pub use state::monotonic_ns;
