//! The command after `--`: found as execvp finds it, checked to load the
//! hooked allocator, and its command line as shown and as the report keeps
//! it.

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};
use object::Object as _;

use crate::error::TraceError;

/// A command line for display: arguments joined with spaces, each escaped
/// as every target-controlled string is (`escape::bytes`: invalid UTF-8 and
/// controls as `\xNN`), cut after `MAX_CMDLINE` bytes with ` [...]` as the
/// reports cut a process's command line. The command's bytes themselves
/// are never changed.
pub fn display_command(args: &[OsString]) -> String {
    let mut shown = Vec::new();
    let mut left = crate::tracee::process::MAX_CMDLINE;
    for arg in args {
        if left == 0 {
            shown.push("[...]".to_string());
            break;
        }
        let bytes = arg.as_bytes();
        let cut = &bytes[..bytes.len().min(left)];
        left -= cut.len();
        let mut text = crate::escape::bytes(cut);
        if cut.len() < bytes.len() {
            text.push_str(" [...]");
            shown.push(text);
            break;
        }
        shown.push(text);
    }
    shown.join(" ")
}

/// The command line as the report keeps it (one per process): the raw
/// argv, NUL-separated as in /proc/PID/cmdline, cut at `MAX_CMDLINE`.
pub fn report_command(args: &[OsString]) -> String {
    let mut raw = Vec::new();
    for arg in args {
        raw.extend_from_slice(arg.as_bytes());
        raw.push(0);
        if raw.len() >= crate::tracee::process::MAX_CMDLINE {
            raw.truncate(crate::tracee::process::MAX_CMDLINE);
            break;
        }
    }
    crate::tracee::process::command_line(&raw)
}

/// `program` as execvp would find it.
pub(super) fn find_program(program: &OsStr) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = if program.as_bytes().contains(&b'/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
            .unwrap_or_default()
    };
    candidates
        .into_iter()
        .find(|p| is_executable(p))
        .with_context(|| {
            format!(
                "command not found or not executable: {}",
                // Escaped where main prints the error.
                program.to_string_lossy()
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Only dynamically linked programs load the libc whose allocator is hooked.
pub fn check_dynamic(path: &Path) -> anyhow::Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Ok(file) = object::File::parse(&*data) else {
        // A script: its interpreter is dynamically linked or it fails later.
        return Ok(());
    };
    let has_interp = file.section_by_name(".interp").is_some();
    // A static executable is its own allocator: traceable when its symbol
    // table still names malloc and free.
    if !has_interp && !crate::tracee::elf::ObjectInfo::parse(path)?.defines_malloc_and_free() {
        bail!(TraceError::StaticCommand(path.display().to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_is_displayed_with_odd_bytes_escaped() {
        let args = [
            OsString::from("/bin/echo"),
            OsStr::from_bytes(b"\xff\xfe-x").to_os_string(),
            OsString::from("\u{1b}[31mred\n"),
            OsString::from("caf\u{e9}"),
        ];
        assert_eq!(
            display_command(&args),
            r"/bin/echo \xff\xfe-x \x1b[31mred\n café"
        );
    }

    #[test]
    fn a_huge_command_line_is_cut_at_4_kib_for_display_and_the_report() {
        let args = [
            OsString::from("/bin/echo"),
            OsString::from("a".repeat(1 << 20)),
            OsString::from("never-shown"),
        ];
        let shown = display_command(&args);
        assert!(shown.len() < 4200, "{}", shown.len());
        assert!(
            shown.ends_with("aaa [...]"),
            "{}",
            &shown[shown.len() - 20..]
        );
        assert!(!shown.contains("never-shown"));
        let kept = report_command(&args);
        assert!(kept.len() < 4200, "{}", kept.len());
        assert!(kept.starts_with("/bin/echo aaa") && kept.ends_with(" [...]"));
        // Short ones are whole.
        let short = [OsString::from("/bin/ls"), OsString::from("-l")];
        assert_eq!(display_command(&short), "/bin/ls -l");
        assert_eq!(report_command(&short), "/bin/ls -l");
    }
}
