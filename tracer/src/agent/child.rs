//! The agent's tracer processes end with it: the kernel sends them SIGINT
//! (as Ctrl-C, so a trace still writes its report) when the agent's thread
//! that started them dies.

use std::os::unix::process::CommandExt as _;

/// Sets `command` to get SIGINT when the calling thread dies.
pub(super) fn ends_with_the_agent(command: &mut std::process::Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
