//! What the collector tells the session about the traced set.

/// A process that joined or left the traced set, in the order the kernel
/// saw it (see tracer_common::EVENT_FORK / EVENT_EXIT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessChange {
    Forked {
        child: u32,
        parent: u32,
    },
    /// `comm`: the new image's thread name, for when the command line can
    /// no longer be read.
    Executed {
        pid: u32,
        comm: String,
    },
    Exited {
        pid: u32,
    },
}
