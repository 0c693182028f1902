//! The BPF side from user space: checking privileges, loading the object,
//! planning and attaching the uprobes (placement, uprobe sessions), and
//! the kernel facts the programs need (BTF offsets).

pub mod counters;
pub mod hooks;
pub mod kernel_btf;
pub mod kernel_features;
mod links;
pub mod loader;
pub mod map_count;
mod object_maps;
// Used by build.rs, which fails the build on a name the object lacks; the
// library only tests it.
#[cfg(test)]
mod object_names;
mod object_patch;
mod options;
mod pinned;
pub mod placement;
pub mod plan;
pub mod preflight;
pub mod roles;
mod session_btf;
pub mod uprobe_session;
mod verifier;

pub use options::{CgroupFilter, Limits, ProbePlacement, Sessions, UnwindMode};
