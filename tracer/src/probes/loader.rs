//! Loading the BPF object and attaching it from a declarative table.
//!
//! `load` (load.rs) loads the object in the best unwind mode the kernel
//! takes and attaches the kernel's own hooks (kernel_programs.rs);
//! `attach` (attach.rs) hooks a traced file as the plan places its probes;
//! `Loaded` (loaded.rs) holds the object and its control maps;
//! `Loaded::detach_in_background` (detach.rs) ends it all.

mod ahead;
mod attach;
mod detach;
mod kernel_programs;
mod load;
mod loaded;

pub use ahead::load_ahead;
pub use attach::{attach, attach_binary_entry, AttachOptions};
pub use detach::Detaching;
#[cfg(test)]
pub(crate) use load::bpf_object;
pub use load::MAX_FILTERED_PIDS;
pub use loaded::{EventMaps, Loaded};

/// Loads the BPF object for a trace of `limits` (load.rs), or hands over
/// the programs loaded ahead of it when they serve it (ahead.rs).
pub fn load(
    limits: &crate::probes::Limits,
    features: &crate::probes::kernel_features::KernelFeatures,
    verbose: bool,
) -> anyhow::Result<(Loaded, EventMaps)> {
    if let Some(given) = ahead::take_for(limits)? {
        return Ok(given);
    }
    load::load(limits, features, verbose)
}
