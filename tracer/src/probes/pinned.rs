//! The file a probe is attached to, held open while it is attached.
//!
//! The kernel resolves a uprobe's path when the probe is made
//! (perf_event_open, BPF_LINK_CREATE). The paths the tracer has are
//! /proc/PID/map_files/... for a running process, which vanish when it
//! execs, and paths inside its root, which may name another file once a
//! package is upgraded. Held open (`O_PATH`: nothing is read, and no
//! special file can block) and checked to be the file that was parsed,
//! the object is handed to the kernel as /proc/self/fd/N: the probes go on
//! exactly that file whatever happens to its path meanwhile.

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use crate::tracee::elf::FileId;

/// A file held open for as long as its probes are being attached.
pub struct Pinned {
    fd: OwnedFd,
}

/// Why a file could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is no longer the file that was read (replaced, or its process exec'ed)")]
    Changed { path: PathBuf },
}

impl Pinned {
    /// Opens `path` and checks that it is the file `id` (device, inode).
    pub fn open(path: &Path, id: FileId) -> Result<Pinned, PinError> {
        let open_error = |source| PinError::Open {
            path: path.to_path_buf(),
            source,
        };
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| open_error(std::io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: a valid C string; the fd returned, if any, is ours.
        let raw = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(open_error(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` was just opened and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fstat writes into the zeroed struct; `fd` is open.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(open_error(std::io::Error::last_os_error()));
        }
        if (st.st_dev, st.st_ino) != id {
            return Err(PinError::Changed {
                path: path.to_path_buf(),
            });
        }
        Ok(Pinned { fd })
    }

    /// The path the kernel resolves to this very file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_pinned_only_if_it_is_the_one_read() {
        let dir = std::env::temp_dir().join(format!("memtrace-pinned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::write(&a, b"a").expect("a");
        std::fs::write(&b, b"b").expect("b");
        let id_a = crate::tracee::elf::file_id(&a).expect("id");
        let pinned = Pinned::open(&a, id_a).expect("pinned");
        // Its path names the file even once it is renamed away.
        std::fs::rename(&a, dir.join("moved")).expect("rename");
        assert_eq!(std::fs::read(pinned.path()).expect("read"), b"a");
        assert!(matches!(
            Pinned::open(&b, id_a),
            Err(PinError::Changed { .. })
        ));
        assert!(matches!(Pinned::open(&a, id_a), Err(PinError::Open { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
