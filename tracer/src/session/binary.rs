//! `--binary PATH`: every process running a program file. New processes
//! are found by their exec (and their entry point, in the kernel) and by
//! scanning /proc; the bookkeeping of which joined, left or exited is here.

use crate::collect::ProcessChange;
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::{
    error::TraceError,
    probes::{hooks::Hooks, loader::Loaded},
    report::{Note, ProcessInfo},
    tracee::{
        launch::check_dynamic,
        process::{has_exited, read_cmdline},
        search::Program,
    },
};

pub struct Binary {
    /// The program file (symbolic links resolved).
    pub path: PathBuf,
    /// The path as given (made absolute), when it is a symbolic link to
    /// `path`: `/usr/bin/redis-server` runs `redis-check-rdb`, and is
    /// named as given.
    pub given: Option<PathBuf>,
    /// The live processes seen running it (or that ran it and exec'ed
    /// another program), with their command lines. A process leaves this
    /// map, and the others below, when it exits (`poll`): they are bounded
    /// by the processes alive at once, not by those that ever ran.
    known: BTreeMap<u32, String>,
    /// Live processes that could not be added to the filter map (full).
    untraced: BTreeSet<u32>,
    /// Processes that could not be traced, ever (the note's count).
    untraced_total: u64,
    /// Live processes that exec'ed another program: no longer traced.
    left: BTreeSet<u32>,
    /// The first NOTED_EXECS processes that exec'ed away, for the notes,
    /// and how many did in all.
    left_noted: Vec<u32>,
    left_total: u64,
    /// Processes hooked at the start, until `poll` adds them to the filter
    /// (a pid the hooks know that is not one of these is a new process
    /// with an old one's pid, hooked again).
    initial: BTreeSet<u32>,
}

/// Processes that exec'ed away named one by one in the notes; the rest are
/// counted.
const NOTED_EXECS: usize = 32;

impl Binary {
    /// Checks that `binary` names a dynamically linked program file.
    pub fn new(binary: &Path) -> anyhow::Result<Binary> {
        let path = check_binary(binary)?;
        if !is_elf(&path) {
            anyhow::bail!(
                "--binary {}: not an ELF executable (a script runs as its interpreter): pass \
                 the interpreter's path, or start the script with `-- {}`",
                path.display(),
                path.display()
            );
        }
        check_dynamic(&path)?;
        let given = std::path::absolute(binary)
            .ok()
            .filter(|given| *given != path);
        Ok(Binary {
            path,
            given,
            known: BTreeMap::new(),
            untraced: BTreeSet::new(),
            untraced_total: 0,
            left: BTreeSet::new(),
            left_noted: Vec::new(),
            left_total: 0,
            initial: BTreeSet::new(),
        })
    }

    /// Probes the program's entry point (new processes join the traced set
    /// there) and the allocators of the processes running it now, or of
    /// the program as the loader will load it.
    pub fn hook_initial(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> anyhow::Result<()> {
        crate::probes::loader::attach_binary_entry(loaded, &self.path)?;
        for pid in running(&self.path) {
            hooks.hook_running(loaded, pid, Program::running(pid), None);
            self.initial.insert(pid);
        }
        if hooks.is_empty() {
            // Nothing runs it yet (or those that do could not be read):
            // hook what the loader will load for it.
            hooks.hook(loaded, &Program::to_start(&self.path), None, None)?;
        }
        Ok(())
    }

    /// Process `pid` called exec: it starts or stops being traced.
    /// Returns true when its maps must be read now.
    pub fn on_exec(&mut self, pid: u32, loaded: &mut Loaded, hooks: &mut Hooks) -> bool {
        // Gone already (a short-lived process): it did not leave.
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            return false;
        };
        if runs_program(&exe, &self.path) {
            // New, or back after running something else, or a new process
            // with the pid of one that exited.
            let known = self.known.contains_key(&pid);
            if !known || self.left.contains(&pid) {
                if loaded.add_filtered_pid(pid).is_err() {
                    self.not_traced(pid);
                    return false;
                }
                self.left.remove(&pid);
                self.known.insert(pid, read_cmdline(pid));
            }
            hooks.hook_running(loaded, pid, Program::just_executed(pid), None);
            return true;
        }
        if self.known.contains_key(&pid) && !self.left.contains(&pid) {
            // It no longer runs the binary: stop recording it.
            let _ = loaded.remove_filtered_pid(pid);
            self.left.insert(pid);
            self.left_total += 1;
            if self.left_noted.len() < NOTED_EXECS {
                self.left_noted.push(pid);
            }
        }
        false
    }

    fn not_traced(&mut self, pid: u32) {
        if self.untraced.insert(pid) {
            self.untraced_total += 1;
        }
    }

    /// A child forked by a traced process runs the binary too, and joined
    /// the traced set in the kernel at fork.
    pub fn on_process_changes(&mut self, changes: Vec<ProcessChange>) {
        for change in changes {
            if let ProcessChange::Forked { child, parent } = change {
                let mut command = read_cmdline(child);
                if command.is_empty() {
                    command = self.known.get(&parent).cloned().unwrap_or_default();
                }
                self.known.insert(child, command);
                self.left.remove(&child);
            }
        }
    }

    /// Called every POLL_INTERVAL: picks up new processes running the
    /// binary (their allocations before that are not seen). Returns the
    /// processes found, whose maps to read now.
    pub fn poll(&mut self, loaded: &mut Loaded, hooks: &mut Hooks) -> Vec<u32> {
        let now = running(&self.path);
        let mut found = Vec::new();
        // Exited processes leave the filter, so that a new process that
        // reuses the pid is not traced for running something else, and are
        // forgotten: a pid seen again is a new process.
        let exited: Vec<u32> = (self.known.keys().chain(&self.untraced))
            .copied()
            .filter(|pid| now.binary_search(pid).is_err() && has_exited(*pid))
            .collect();
        for pid in exited {
            if self.known.remove(&pid).is_some() && !self.left.remove(&pid) {
                let _ = loaded.remove_filtered_pid(pid);
            }
            self.untraced.remove(&pid);
        }
        for pid in now {
            if self.known.contains_key(&pid) || self.untraced.contains(&pid) {
                continue;
            }
            // A full filter map must not end the trace: count and go on.
            if loaded.add_filtered_pid(pid).is_err() {
                self.not_traced(pid);
                continue;
            }
            // A pid the hooks saw under an earlier process is read again.
            let hooked_at_start = self.initial.remove(&pid);
            if !hooks.knows(pid) || !hooked_at_start {
                hooks.hook_running(loaded, pid, Program::running(pid), None);
            }
            found.push(pid);
            self.known.insert(pid, read_cmdline(pid));
        }
        found
    }

    /// The program as the user named it (the file it resolves to noted):
    /// "/usr/bin/redis-server (/usr/bin/redis-check-rdb)", escaped.
    pub fn shown(&self) -> String {
        match &self.given {
            Some(given) => format!(
                "{} ({})",
                crate::escape::path(given),
                crate::escape::path(&self.path)
            ),
            None => crate::escape::path(&self.path),
        }
    }

    /// The name its frames and processes carry: the path given.
    pub fn name(&self) -> &Path {
        self.given.as_deref().unwrap_or(&self.path)
    }

    /// Processes that could not be traced, and those that left.
    pub fn notes(&self) -> Vec<Note> {
        let mut notes = Vec::new();
        if self.untraced_total > 0 {
            notes.push(Note::BinaryProcessesNotTraced {
                processes: self.untraced_total,
                path: self.path.display().to_string(),
                max_pids: crate::probes::loader::MAX_FILTERED_PIDS,
            });
        }
        for &pid in &self.left_noted {
            notes.push(Note::ExecedAway { pid });
        }
        let more = self.left_total - self.left_noted.len() as u64;
        if more > 0 {
            notes.push(Note::Text(format!(
                "{more} more processes exec'ed another program and were no longer traced \
                 from then on"
            )));
        }
        notes
    }

    /// Adds the processes running the binary that made no recorded
    /// allocation to the report's list (those that exited are left out:
    /// the list of exited processes is bounded, see --exited-processes).
    pub fn merge_processes(&self, all: &mut Vec<ProcessInfo>) {
        for (&pid, command) in &self.known {
            if !has_exited(pid) && !all.iter().any(|p| p.pid == pid) {
                all.push(super::facts::process_info(pid, command.clone(), false));
            }
        }
        all.sort_by_key(|p| (p.folded > 0, p.pid, p.start_time));
    }
}

/// Pids whose /proc/PID/exe is `path`, sorted.
fn running(path: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| runs_program(&exe, path))
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether a process whose /proc/PID/exe reads `exe` runs the program at
/// `path`: also when the file it runs was deleted or replaced since (a
/// package upgrade under a running service), which the kernel shows as
/// "PATH (deleted)"; its objects are then read through map_files.
fn runs_program(exe: &Path, path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let exe = exe.as_os_str().as_bytes();
    exe.strip_suffix(b" (deleted)").unwrap_or(exe) == path.as_os_str().as_bytes()
}

/// The `--binary` path, resolved, once it names a program file that a
/// process can run; otherwise what is wrong with it.
fn check_binary(binary: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let shown = binary.display();
    let path = std::fs::canonicalize(binary).with_context(|| {
        format!("--binary {shown}: no such file: pass the path of the program to trace")
    })?;
    let meta = std::fs::metadata(&path).with_context(|| format!("--binary {shown}"))?;
    if meta.is_dir() {
        anyhow::bail!("--binary {shown} is a directory: pass the path of the program file in it");
    }
    if is_shared_library(&path) {
        anyhow::bail!(
            "--binary {shown} is a shared library, not a program: pass the program that loads \
             it (--binary PROGRAM or --pid PID)"
        );
    }
    if let Ok(info) = crate::tracee::elf::ObjectInfo::parse(&path) {
        let exe = path.display().to_string();
        if !info.is_native() {
            let machine = info.machine().to_string();
            return Err(TraceError::NotX86_64 { exe, machine }.into());
        }
        if info.is_static() && !info.defines_malloc_and_free() && info.has_symbols() {
            return Err(TraceError::OwnAllocator { exe }.into());
        }
    }
    // A script has its own message (is_elf in Scope::start).
    if meta.permissions().mode() & 0o111 == 0 && is_elf(&path) {
        anyhow::bail!(
            "--binary {shown} is not executable (mode {:o}), so no process runs it: pass the \
             program file, or make it executable with chmod +x",
            meta.permissions().mode() & 0o7777
        );
    }
    Ok(path)
}

/// An ELF shared object that is not an executable: no interpreter and no
/// DF_1_PIE flag (a position-independent executable has one or both).
fn is_shared_library(path: &Path) -> bool {
    use object::read::elf::{FileHeader as _, ProgramHeader as _};
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else {
        return false;
    };
    let endian = elf.endian();
    if elf.elf_header().e_type(endian) != object::elf::ET_DYN {
        return false;
    }
    let has_interp = elf
        .elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP);
    let pie = elf
        .elf_section_table()
        .dynamic_table(endian, &*data)
        .unwrap_or_default()
        .iter()
        .any(|d| d.tag == object::elf::DT_FLAGS_1 && d.val & u64::from(object::elf::DF_1_PIE) != 0);
    !has_interp && !pie
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::runs_program;

    #[test]
    fn a_replaced_or_deleted_program_still_runs_the_binary() {
        let path = Path::new("/usr/sbin/my service");
        assert!(runs_program(Path::new("/usr/sbin/my service"), path));
        assert!(runs_program(
            Path::new("/usr/sbin/my service (deleted)"),
            path
        ));
        assert!(!runs_program(Path::new("/usr/sbin/my service2"), path));
        assert!(!runs_program(Path::new("/usr/sbin/my (deleted)"), path));
    }
}
