//! Where the report goes (`-o PATH`): checked before anything is attached,
//! written atomically at the end.
//!
//! A path that cannot be written is found before the trace starts, not
//! after an hour of tracing. At the end the report goes to a temporary file
//! in the same directory, which is renamed over PATH once complete: a crash
//! never leaves half a report at PATH, and the temporary file is removed on
//! every error path. If PATH cannot be written at the end (its directory
//! vanished or became read-only meanwhile), the report is saved in the
//! system's temporary directory instead, or failing that on stdout, and the
//! error says where it went.

use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{anyhow, bail, Context as _};

pub use super::interruptible::{abandon_blocked_writes_on_signal, abandoned, Interruptible};

/// A checked `-o` destination.
#[derive(Debug)]
pub struct Output {
    /// Where the user wants the report (symlinks resolved).
    path: PathBuf,
    /// An existing device, FIFO or socket (`-o /dev/stderr`, a terminal,
    /// a named pipe with its reader running): opened without blocking when
    /// the trace starts and kept open until the report is written in place
    /// (a rename would replace the node). Kept open, so that a FIFO's
    /// reader does not see the end of its input before the report.
    in_place: Option<File>,
}

impl Output {
    /// Checks that a report can be written to `path`: its directory exists
    /// and accepts new files, and `path` is not a directory. Creates and
    /// removes a temporary file there to be sure (permissions, read-only
    /// mounts and pseudo file systems such as /proc all show up).
    pub fn prepare(path: &Path) -> anyhow::Result<Output> {
        // Messages are escaped once, where main prints them.
        let shown = path.display();
        // Follow a symlink, so the rename replaces the file it points to.
        let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Ok(meta) = fs::metadata(&path) {
            if meta.is_dir() {
                bail!("-o {shown} is a directory: name a file in it, e.g. -o {shown}/memtrace-report.txt");
            }
            if !meta.is_file() {
                let file = open_special(&path, &meta.file_type())
                    .map_err(|e| anyhow!("-o {shown}: {e}"))?;
                return Ok(Output {
                    path,
                    in_place: Some(file),
                });
            }
        }
        let dir = directory(&path);
        if !dir.is_dir() {
            let dir = dir.display();
            bail!(
                "-o {shown}: the directory {dir} does not exist: create it (mkdir -p {dir}) or \
                 write the report elsewhere"
            );
        }
        let output = Output {
            path,
            in_place: None,
        };
        let (probe, _) = output.create_temporary().map_err(|e| {
            anyhow!(
                "-o {shown}: cannot create a file in {} ({e}): choose a path in a writable directory",
                dir.display()
            )
        })?;
        // Removing what was just created can only fail if someone else
        // removed it first.
        let _ = fs::remove_file(probe);
        Ok(output)
    }

    /// Writes `report` to the destination, atomically for a regular file.
    /// On failure the report is saved elsewhere and the error says where.
    pub fn write(&self, report: &[u8]) -> anyhow::Result<()> {
        self.write_with(&mut |w| Ok(w.write_all(report)?))
    }

    /// `write` of what `render` writes, streamed: a report of a long trace
    /// can be larger than the memory it would take to hold it. `render`
    /// runs again for the fallback destination if the first one fails.
    pub fn write_with(&self, render: &mut Render<'_>) -> anyhow::Result<()> {
        let result = match &self.in_place {
            Some(file) => write_in_place(file, render),
            None => self.replace(render),
        };
        let Err(err) = result else {
            return Ok(());
        };
        let shown = self.path.display();
        match save_elsewhere(&self.path, render) {
            Some(saved) => Err(err.context(format!(
                "the report could not be written to {shown}; it was saved to {saved} instead"
            ))),
            None => Err(err.context(format!(
                "the report could not be written to {shown}, nor to {}; it is on stdout instead",
                std::env::temp_dir().display()
            ))),
        }
    }

    /// Where a report meant for `wanted` goes when `wanted` cannot take
    /// it: a new file in the temporary directory (its name made from the
    /// tracer's pid and `wanted`'s file name).
    pub fn elsewhere(wanted: &Path) -> Output {
        Output {
            path: std::env::temp_dir().join(format!(
                "memtrace-bpf-{}-{}",
                std::process::id(),
                wanted
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "report".into())
            )),
            in_place: None,
        }
    }

    /// The path as given after resolving symlinks, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Temporary file, fsync, permissions, rename over the destination.
    fn replace(&self, render: &mut Render<'_>) -> anyhow::Result<()> {
        let (tmp, file) = self
            .create_temporary()
            .with_context(|| format!("creating a file in {}", directory(&self.path).display()))?;
        let written = (|| -> anyhow::Result<()> {
            let mut out = std::io::BufWriter::new(file);
            render(&mut out).context("writing the report")?;
            let file = out
                .into_inner()
                .map_err(|e| e.into_error())
                .context("writing the report")?;
            // A replaced file keeps its mode; a new one gets 0666 minus
            // the umask, as any file created by the shell.
            if let Ok(meta) = fs::metadata(&self.path) {
                let mode = meta.permissions().mode() & 0o7777;
                file.set_permissions(fs::Permissions::from_mode(mode))
                    .context("copying the permissions of the file it replaces")?;
            }
            file.sync_all().context("flushing the report to disk")?;
            fs::rename(&tmp, &self.path).context("renaming the temporary file into place")
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// `.NAME.PID-N.tmp` beside the destination, created exclusively (no
    /// symlink or existing file is followed, even in /tmp).
    fn create_temporary(&self) -> std::io::Result<(PathBuf, File)> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let tmp = directory(&self.path).join(format!(".{name}.{}-{n}.tmp", std::process::id()));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(&tmp)
            {
                Ok(file) => return Ok((tmp, file)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Writes a whole report to the writer it is given.
pub type Render<'a> = dyn FnMut(&mut dyn Write) -> anyhow::Result<()> + 'a;

/// The directory a new file at `path` goes in ("." for a bare name).
fn directory(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Opens an existing file that is not a regular file, without blocking:
/// a FIFO that no process reads is refused at once (opening it for writing
/// would wait for a reader for ever, beyond the reach of Ctrl-C).
fn open_special(path: &Path, kind: &fs::FileType) -> Result<File, String> {
    let what = if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    if !(kind.is_fifo() || kind.is_char_device() || kind.is_socket()) {
        return Err(format!(
            "{what} cannot take a report: name a regular file, or leave -o out for stdout"
        ));
    }
    match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => Ok(file),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) && kind.is_fifo() => Err(format!(
            "{what} that no process is reading: start its reader first, or name a regular \
             file, or leave -o out for stdout"
        )),
        Err(e) => Err(format!(
            "{what} that cannot be opened for writing ({e}): choose another file"
        )),
    }
}

fn write_in_place(file: &File, render: &mut Render<'_>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(Interruptible::new(file));
    render(&mut out).context("writing the report")?;
    out.flush().context("writing the report")
}

/// Writes what `render` writes to stdout. If stdout blocks (a pipe nobody
/// reads) and a signal abandons the write, the report is saved in the
/// temporary directory and the error says where.
pub fn write_stdout(render: &mut Render<'_>) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(Interruptible::stdout());
    let written = render(&mut out).and_then(|()| Ok(out.flush()?));
    let Err(err) = written else {
        return Ok(());
    };
    if !abandoned() {
        return Err(err.context("writing the report to stdout"));
    }
    drop(out);
    let fallback = Output {
        path: std::env::temp_dir().join(format!("memtrace-bpf-{}-report", std::process::id())),
        in_place: None,
    };
    match fallback.replace(render) {
        Ok(()) => Err(err.context(format!(
            "the report could not be written to stdout; it was saved to {} instead",
            fallback.path.display()
        ))),
        Err(e) => Err(e.context("the report could not be written to stdout, nor saved")),
    }
}

/// Saves `report` in the temporary directory, or writes it to stdout when
/// that fails too; returns the file it went to.
fn save_elsewhere(wanted: &Path, render: &mut Render<'_>) -> Option<String> {
    let fallback = Output::elsewhere(wanted);
    if fallback.replace(render).is_ok() {
        return Some(fallback.path.display().to_string());
    }
    let mut out = std::io::BufWriter::new(Interruptible::stdout());
    let _ = render(&mut out).map(|()| out.flush());
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("memtrace-output-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch dir");
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_report_replaces_the_file_and_leaves_nothing_else() {
        let dir = scratch("replace");
        let path = dir.join("r.txt");
        fs::write(&path, "old report that is longer").expect("write old");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).expect("chmod");
        let out = Output::prepare(&path).expect("prepare");
        assert_eq!(entries(&dir), ["r.txt"], "the check leaves no file behind");
        out.write(b"new\n").expect("write");
        assert_eq!(fs::read(&path).expect("read"), b"new\n");
        assert_eq!(entries(&dir), ["r.txt"]);
        let mode = fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "a replaced file keeps its mode");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_destinations_are_refused_up_front_with_the_remedy() {
        let dir = scratch("bad");
        let err = Output::prepare(&dir).expect_err("a directory").to_string();
        assert!(
            err.contains("is a directory") && err.contains("name a file in it"),
            "{err}"
        );
        let missing = dir.join("no/such/dir/r.txt");
        let err = Output::prepare(&missing)
            .expect_err("no directory")
            .to_string();
        assert!(
            err.contains("does not exist") && err.contains("mkdir -p"),
            "{err}"
        );
        let err = Output::prepare(Path::new("/proc/version"))
            .expect_err("/proc")
            .to_string();
        assert!(err.contains("cannot create a file in /proc"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_that_vanished_sends_the_report_to_the_temporary_directory() {
        let dir = scratch("vanish");
        let out = Output::prepare(&dir.join("r.json")).expect("prepare");
        fs::remove_dir_all(&dir).expect("remove dir");
        let err = format!("{:#}", out.write(b"{}\n").expect_err("directory gone"));
        let saved = err
            .split("it was saved to ")
            .nth(1)
            .and_then(|rest| rest.split(" instead").next())
            .unwrap_or_else(|| panic!("no fallback path in: {err}"));
        assert_eq!(fs::read(saved).expect("read fallback"), b"{}\n");
        let _ = fs::remove_file(saved);
    }

    #[test]
    fn a_device_is_written_in_place() {
        let out = Output::prepare(Path::new("/dev/null")).expect("prepare /dev/null");
        out.write(b"x").expect("write");
        assert!(fs::metadata("/dev/null")
            .expect("stat")
            .file_type()
            .is_char_device());
    }
}
