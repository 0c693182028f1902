//! A traced process's own root directory (`/proc/PID/root`: a chroot or a
//! container), held open so files can be looked up in it after the process
//! exited, and opened inside it without any path escaping it.

use std::{
    collections::HashMap,
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    },
    path::Path,
    sync::{Arc, Weak},
};

/// A process's root directory (O_PATH), or None for the tracer's own.
pub type Root = Option<Arc<File>>;

/// The roots held by objects, shared by every object (and process) with
/// the same root directory. Bounded by the objects held: entries are weak
/// and dead ones are dropped whenever one is added.
#[derive(Default)]
pub struct Roots {
    by_dir: HashMap<(u64, u64), Weak<File>>,
}

impl Roots {
    /// The root of `pid`, and the prefix its paths carry in
    /// /proc/PID/maps as the tracer reads them (a chroot's directory, "" if
    /// none). Our own root gives None: the host's files are opened as they
    /// are.
    pub fn of(&mut self, pid: u32) -> (Root, String) {
        let Ok(dir) = open_path_dir(Path::new(&format!("/proc/{pid}/root"))) else {
            return (None, String::new());
        };
        let (Ok(meta), Ok(ours)) = (dir.metadata(), std::fs::metadata("/")) else {
            return (None, String::new());
        };
        let key = (meta.dev(), meta.ino());
        if key == (ours.dev(), ours.ino()) {
            return (None, String::new());
        }
        // The kernel shows a chroot's paths from our root, with the
        // chroot's directory in front; a root it cannot reach from ours (a
        // container's) reads as "/" and its paths are its own.
        let prefix = std::fs::read_link(format!("/proc/{pid}/root"))
            .ok()
            .and_then(|p| p.to_str().map(|s| s.trim_end_matches('/').to_string()))
            .unwrap_or_default();
        if let Some(root) = self.by_dir.get(&key).and_then(Weak::upgrade) {
            return (Some(root), prefix);
        }
        self.by_dir.retain(|_, w| w.strong_count() > 0);
        let root = Arc::new(dir);
        self.by_dir.insert(key, Arc::downgrade(&root));
        (Some(root), prefix)
    }
}

/// `path` (as the maps show it) as the process sees it inside its root.
pub fn path_in_root(path: &str, prefix: &str) -> String {
    match path.strip_prefix(prefix) {
        Some(rest) if !prefix.is_empty() && rest.starts_with('/') => rest.to_string(),
        _ => path.to_string(),
    }
}

fn open_path_dir(path: &Path) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated string; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens the regular file `path` (absolute, as seen inside `root`) for
/// reading, resolving it inside `root` (our own root for None): every `..`
/// and symbolic link stays inside it (openat2 RESOLVE_IN_ROOT) and magic
/// links (/proc/*/fd) are refused. What it names is looked at before it is
/// opened (`reopen_regular`): a FIFO, a device or a file larger than
/// `max_bytes` is refused without being opened.
pub fn open_in_root(root: Option<&File>, path: &Path, max_bytes: u64) -> io::Result<File> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let c = CString::new(rel.as_os_str().as_bytes())?;
    let own;
    let dir = match root {
        Some(r) => r,
        None => {
            own = open_path_dir(Path::new("/"))?;
            &own
        }
    };
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: the pointers are valid for the call; the size is the struct's.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("fd out of range"))?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    reopen_regular(&unsafe { File::from_raw_fd(fd) }, max_bytes)
}

/// Opens for reading the file a traced process's mapping shows
/// (/proc/PID/map_files/START-END: the very file mapped), as
/// `open_in_root` does: a device mapped is refused without being opened.
pub fn open_mapped(path: &Path, max_bytes: u64) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `c` is a valid NUL-terminated string; the result is checked.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    reopen_regular(&unsafe { File::from_raw_fd(fd) }, max_bytes)
}

/// The file the O_PATH descriptor `at` refers to, opened for reading if
/// it is a regular file of at most `max_bytes` (fstat first, so opening
/// cannot block on a FIFO nor act on a device; the same inode is opened
/// again through /proc/self/fd, so nothing can be swapped in between).
fn reopen_regular(at: &File, max_bytes: u64) -> io::Result<File> {
    let meta = at.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > max_bytes {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too large"));
    }
    let c = CString::new(format!("/proc/self/fd/{}", at.as_raw_fd()))?;
    // SAFETY: `c` is a valid NUL-terminated string; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_taken_out_of_its_chroot_directory() {
        assert_eq!(path_in_root("/tmp/r/app/prog", "/tmp/r"), "/app/prog");
        assert_eq!(path_in_root("/tmp/rx/prog", "/tmp/r"), "/tmp/rx/prog");
        assert_eq!(path_in_root("/app/prog", ""), "/app/prog");
    }

    #[test]
    fn symbolic_links_and_dot_dots_stay_inside_the_root() {
        let dir = std::env::temp_dir().join(format!("memtrace-roots-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("d")).expect("mkdir");
        std::fs::write(dir.join("outside"), b"secret").expect("write");
        std::fs::write(root.join("outside"), b"inside").expect("write");
        std::os::unix::fs::symlink(dir.join("outside"), root.join("d/abs")).expect("symlink");
        std::os::unix::fs::symlink("../../../outside", root.join("d/rel")).expect("symlink");
        let r = open_path_dir(&root).expect("open root");
        let read = |p: &str| {
            let mut s = String::new();
            use std::io::Read as _;
            open_in_root(Some(&r), Path::new(p), u64::MAX)
                .map(|mut f| f.read_to_string(&mut s).map(|_| s))
        };
        // An absolute link names a path inside the root, not the host's.
        let abs = read("/d/abs");
        assert!(abs.is_err(), "{abs:?}");
        assert_eq!(read("/d/rel").expect("rel").expect("read"), "inside");
        assert_eq!(
            read("/../../outside").expect("dots").expect("read"),
            "inside"
        );
        assert!(read("/d").is_err(), "a directory is refused");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fifo_a_device_and_a_file_too_large_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("memtrace-roots-kinds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let fifo = dir.join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).expect("path");
        // SAFETY: `c` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        std::fs::write(dir.join("big"), [0u8; 100]).expect("write");
        let r = open_path_dir(&dir).expect("open root");
        // No writer: a blocking open would wait here for good.
        let e = open_in_root(Some(&r), Path::new("/fifo"), u64::MAX).expect_err("a FIFO");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let e = open_in_root(None, Path::new("/dev/null"), u64::MAX).expect_err("a device");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(
            open_in_root(Some(&r), Path::new("/big"), 99).is_err(),
            "too large"
        );
        assert!(open_in_root(Some(&r), Path::new("/big"), 100).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
