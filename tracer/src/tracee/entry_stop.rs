//! A started command held once more at its program's entry point, after
//! the dynamic loader has mapped the libraries it needs and before `main`:
//! a one-shot breakpoint (`int3`) written with ptrace at the exec stop.
//!
//! Why: with `--unwind tables` the kernel walks a stack only through
//! mappings user space has described. At the exec stop only the program
//! and the loader are mapped; libc and the other libraries come later.
//! A command that allocates at once (ripgrep, a test program that starts
//! working immediately) made thousands of walks stop at the first libc
//! frame and hand a stack copy to user space before it had read the maps
//! again: seconds of user-space unwinding, and a full ring buffer. At the
//! entry point every `DT_NEEDED` library is mapped: describing the maps
//! there leaves only what library constructors allocate, and libraries
//! opened later (`dlopen`), to the copy path.
//!
//! The entry point is `AT_ENTRY` of the new image's auxiliary vector
//! (`/proc/PID/auxv`): the program's entry with its load bias applied.
//! Only the thread ptrace follows (the command's first thread) ever runs
//! `_start`; constructors that start threads do not jump there.

use std::io;

/// `AT_ENTRY` in the auxiliary vector (elf.h).
const AT_ENTRY: u64 = 9;

/// The `int3` instruction.
const INT3: i64 = 0xcc;

/// A breakpoint written at a process's entry point: where, and the word
/// it replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryBreak {
    addr: u64,
    word: i64,
}

/// The entry point in an auxiliary vector (native-endian u64 pairs).
fn entry_in_auxv(auxv: &[u8]) -> Option<u64> {
    auxv.chunks_exact(16)
        .map(|pair| {
            let word = |i: usize| u64::from_ne_bytes(pair[i..i + 8].try_into().unwrap_or([0; 8]));
            (word(0), word(8))
        })
        .take_while(|&(key, _)| key != 0)
        .find(|&(key, _)| key == AT_ENTRY)
        .map(|(_, value)| value)
        .filter(|&entry| entry != 0)
}

/// The word at `addr` with its low byte (the first instruction byte on
/// little-endian x86-64) replaced by `int3`.
fn with_int3(word: i64) -> i64 {
    (word & !0xff) | INT3
}

impl EntryBreak {
    /// Writes the breakpoint into `pid`, which must be our ptrace-stopped
    /// tracee (at its exec stop). None when the entry point cannot be found
    /// or written: the command then runs without this stop.
    pub fn set(pid: libc::pid_t) -> Option<EntryBreak> {
        let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
        let addr = entry_in_auxv(&auxv)?;
        let word = peek(pid, addr).ok()?;
        poke(pid, addr, with_int3(word)).ok()?;
        Some(EntryBreak { addr, word })
    }

    /// At a SIGTRAP stop of `pid`: whether it is this breakpoint (the
    /// instruction pointer just past it). If so, the original word is back
    /// and the instruction pointer at the entry point again, ready to run.
    pub fn hit(&self, pid: libc::pid_t) -> bool {
        let Ok(mut regs) = get_regs(pid) else {
            return false;
        };
        if regs.rip != self.addr + 1 {
            return false;
        }
        regs.rip = self.addr;
        self.remove(pid) && set_regs(pid, &regs).is_ok()
    }

    /// Puts the original word back (the tracer lets the command go before
    /// it reached its entry point). Whether it could.
    pub fn remove(&self, pid: libc::pid_t) -> bool {
        poke(pid, self.addr, self.word).is_ok()
    }
}

fn peek(pid: libc::pid_t, addr: u64) -> io::Result<i64> {
    // PTRACE_PEEKTEXT returns the word; -1 is a valid word, so errno tells.
    // SAFETY: a ptrace read of our own stopped tracee's memory; errno is
    // this thread's.
    unsafe {
        *libc::__errno_location() = 0;
        let word = libc::ptrace(
            libc::PTRACE_PEEKTEXT,
            pid,
            addr as *mut libc::c_void,
            std::ptr::null_mut::<libc::c_void>(),
        );
        if word == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(word)
    }
}

fn poke(pid: libc::pid_t, addr: u64, word: i64) -> io::Result<()> {
    // SAFETY: a ptrace write of one word into our own stopped tracee.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_POKETEXT,
            pid,
            addr as *mut libc::c_void,
            word as *mut libc::c_void,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn get_regs(pid: libc::pid_t) -> io::Result<libc::user_regs_struct> {
    // SAFETY: user_regs_struct is plain integers, valid zeroed; ptrace
    // fills it for our own stopped tracee.
    unsafe {
        let mut regs: libc::user_regs_struct = std::mem::zeroed();
        let rc = libc::ptrace(
            libc::PTRACE_GETREGS,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            (&mut regs as *mut libc::user_regs_struct).cast::<libc::c_void>(),
        );
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(regs)
    }
}

fn set_regs(pid: libc::pid_t, regs: &libc::user_regs_struct) -> io::Result<()> {
    // SAFETY: ptrace reads the registers from our struct into our own
    // stopped tracee.
    let rc = unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGS,
            pid,
            std::ptr::null_mut::<libc::c_void>(),
            (regs as *const libc::user_regs_struct)
                .cast_mut()
                .cast::<libc::c_void>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auxv(pairs: &[(u64, u64)]) -> Vec<u8> {
        pairs
            .iter()
            .flat_map(|&(k, v)| [k.to_ne_bytes(), v.to_ne_bytes()])
            .flatten()
            .collect()
    }

    #[test]
    fn the_entry_point_is_read_from_the_auxiliary_vector() {
        let v = auxv(&[(33, 0x7fff_0000), (AT_ENTRY, 0x5555_1040), (0, 0)]);
        assert_eq!(entry_in_auxv(&v), Some(0x5555_1040));
    }

    #[test]
    fn no_entry_point_past_the_end_marker_or_in_a_short_vector() {
        let v = auxv(&[(6, 4096), (0, 0), (AT_ENTRY, 0x1000)]);
        assert_eq!(entry_in_auxv(&v), None);
        assert_eq!(entry_in_auxv(&v[..8]), None);
        assert_eq!(entry_in_auxv(&auxv(&[(AT_ENTRY, 0)])), None);
    }

    #[test]
    fn int3_replaces_the_first_byte_only() {
        assert_eq!(with_int3(0x1122_3344_5566_7788), 0x1122_3344_5566_77cc);
        assert_eq!(with_int3(-1), -0x34);
    }
}
