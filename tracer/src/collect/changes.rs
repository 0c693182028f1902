//! What the collector tells the session about the traced set.

/// A process that joined or left the traced set, in the order the kernel
/// saw it (see tracer_common::EventKind::Fork / Exit).
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

/// An exec whose new image the session has not inspected yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exec {
    pub pid: u32,
    /// Called from a thread other than the main one: the process's main
    /// task is now another (see tracer_common::EventKind::Exec).
    pub from_thread: bool,
}
