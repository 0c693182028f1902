//! Uprobe session programs (kernel >= 6.13): one BPF program runs at a
//! function's entry and, only if the entry run returned 0, at its return.
//! Unrecorded calls (most of them, when sampling) then cost no return probe,
//! which is about 0.6 µs per call (measured on a 6.18 host).
//!
//! aya 0.14 cannot load or attach them, so this module does it with the
//! bpf(2) syscall. The session program is a small dispatcher, assembled
//! here, that tail-calls the ordinary programs aya loaded:
//!
//! ```text
//!     if bpf_session_is_return():  tail_call(PROGS, RETURN_SLOT)
//!     else:                        tail_call(PROGS, cookie & ROLE_MASK)
//!     return 0            // tail call failed: keep the return run
//! ```
//!
//! The rest of the cookie says where arguments are when the probe sits
//! past instructions that moved them (tracer_common::cookie); the entry
//! programs read it themselves. They return 1 ("skip the return run") for
//! calls they do not record; the tail-called program's return value is the
//! dispatcher's (so they are written with tracer-ebpf's `entry_program!`:
//! aya's `#[uprobe]` wrapper returns 0 whatever its function returns).
//! If the kernel refuses any step, the caller falls back to uprobes plus
//! uretprobes.

use std::{
    collections::HashMap,
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use anyhow::{bail, Context as _};
use aya::{Btf, BtfError};

mod insn;
mod relocate;

use insn::{call, insn, ld_map_fd, mov_imm, mov_reg, Insn, EXIT};
use relocate::relocated_program;

/// BPF_TRACE_UPROBE_SESSION in the kernel's (newer) uapi/linux/bpf.h.
const BPF_TRACE_UPROBE_SESSION: u32 = 57;
/// BPF_TRACE_UPROBE_MULTI: a uprobe_multi link without a return run, for
/// free(). The kernel runs its program straight from the uprobe's handler
/// chain; a perf-event uprobe's dispatcher takes its filter's rwlock on
/// every hit, a cache line that two threads freeing at once bounce between
/// their CPUs (about 0.1 µs a free here).
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;

/// Slot of the return program in the PROGS program array; entry programs
/// sit at their `Role` number.
pub const RETURN_SLOT: u32 = 15;

const HELPER_TAIL_CALL: i32 = 12;
const HELPER_GET_ATTACH_COOKIE: i32 = 174;
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;

/// The dispatcher's instructions (see the module comment).
fn dispatcher(progs_fd: RawFd, is_return_btf_id: u32) -> Vec<Insn> {
    let mut p = vec![
        mov_reg(6, 1),
        call(BPF_PSEUDO_KFUNC_CALL, is_return_btf_id as i32),
        // if r0 != 0 goto RET (index 13)
        insn(0x55, 0, 0, 10, 0),
        mov_reg(1, 6),
        call(0, HELPER_GET_ATTACH_COOKIE),
        // r0 &= cookie::ROLE_MASK: the rest says where arguments are.
        insn(0x57, 0, 0, 0, tracer_common::cookie::ROLE_MASK as i32),
        mov_reg(3, 0),
        mov_reg(1, 6),
    ];
    p.extend(ld_map_fd(2, progs_fd));
    p.extend([call(0, HELPER_TAIL_CALL), mov_imm(0, 0), EXIT]);
    // RET:
    p.push(mov_reg(1, 6));
    p.extend(ld_map_fd(2, progs_fd));
    p.extend([
        mov_imm(3, RETURN_SLOT as i32),
        call(0, HELPER_TAIL_CALL),
        mov_imm(0, 0),
        EXIT,
    ]);
    debug_assert_eq!(p.len(), 20);
    p
}

/// The bpf(2) system call with a zero-padded attribute block.
pub(super) fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> std::io::Result<RawFd> {
    // SAFETY: `attr` is a zero-padded bpf_attr of 128 bytes, larger than
    // either command's struct; pointers in it point to live buffers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as RawFd)
    }
}

/// Loads the dispatcher. `progs_fd` is the PROGS program array.
pub fn load_dispatcher(progs_fd: RawFd) -> anyhow::Result<OwnedFd> {
    let btf = Btf::from_sys_fs().context("reading the kernel's BTF")?;
    let id = btf
        .id_by_type_name_kind("bpf_session_is_return", aya_obj::btf::BtfKind::Func)
        .map_err(|e: BtfError| anyhow::anyhow!("kernel has no bpf_session_is_return: {e}"))?;
    load_program(
        &dispatcher(progs_fd, id),
        "memtrace_sess",
        BPF_TRACE_UPROBE_SESSION,
        None,
    )
}

/// BPF_PROG_LOAD of a kprobe-type program with `expected_attach_type`.
/// `subprograms`: where each subprogram starts (0 first) and whether it is
/// global, when the program needs BTF function info (it takes a
/// function's address, or calls a global function).
fn load_program(
    insns: &[Insn],
    name: &str,
    expected_attach_type: u32,
    subprograms: Option<&[(usize, Option<u32>)]>,
) -> anyhow::Result<OwnedFd> {
    let license = CString::new("Dual MIT/GPL").context("license")?;
    let mut log = vec![0u8; 1 << 20];
    let mut attr = [0u64; 16];
    attr[0] = u64::from(BPF_PROG_TYPE_KPROBE) | ((insns.len() as u64) << 32);
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // log_level 4 (BPF_LOG_STATS): the error and the statistics only; level
    // 1 logs every branch explored, which slows verification severalfold.
    attr[3] = 4 | ((log.len() as u64) << 32);
    attr[4] = log.as_mut_ptr() as u64;
    // prog_name at byte 48 (16 bytes, NUL-terminated), expected_attach_type
    // at byte 68.
    let mut prog_name = [0u8; 16];
    for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    attr[6] = u64::from_le_bytes(prog_name[..8].try_into().context("name")?);
    attr[7] = u64::from_le_bytes(prog_name[8..].try_into().context("name")?);
    attr[8] = u64::from(expected_attach_type) << 32;
    // prog_btf_fd and func_info_rec_size at 72, func_info at 80,
    // func_info_cnt at 88.
    let func_info = subprograms.map(super::session_btf::load).transpose()?;
    if let Some(info) = &func_info {
        attr[9] = info.btf.as_raw_fd() as u64 | (8u64 << 32);
        attr[10] = info.records.as_ptr() as u64;
        attr[11] = info.records.len() as u64;
    }
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: a new fd that we own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(0);
            let text = String::from_utf8_lossy(&log[..end]);
            // The end of the verifier log says why.
            let tail: Vec<&str> = text.lines().rev().take(3).collect();
            bail!(
                "{e}: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )
        }
    }
}

/// Puts program `prog` at `index` of the program array `map_fd`.
pub fn set_prog_slot(map_fd: RawFd, index: u32, prog: &OwnedFd) -> anyhow::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    let value: u32 = prog.as_raw_fd() as u32;
    let mut attr = [0u64; 16];
    attr[0] = map_fd as u64;
    attr[1] = &index as *const u32 as u64;
    attr[2] = &value as *const u32 as u64;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).context("filling the session tail-call table")?;
    Ok(())
}

/// Attaches the dispatcher to `offsets` in `path` for process `pid`, each
/// with its cookie (the role). Closing the returned fd detaches it.
pub fn attach(
    prog: &OwnedFd,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> anyhow::Result<OwnedFd> {
    link_create(prog, BPF_TRACE_UPROBE_SESSION, path, offsets, cookies, pid)
        .context("creating the uprobe session link")
}

/// Attaches `prog` (a copy from `load_copies(.., false)`) to `offsets` in
/// `path` for process `pid` as a uprobe_multi link: entry only, no cookies.
pub fn attach_multi(
    prog: &OwnedFd,
    path: &Path,
    offsets: &[u64],
    pid: u32,
) -> anyhow::Result<OwnedFd> {
    let cookies = vec![0u64; offsets.len()];
    link_create(prog, BPF_TRACE_UPROBE_MULTI, path, offsets, &cookies, pid)
        .context("creating the uprobe_multi link")
}

fn link_create(
    prog: &OwnedFd,
    attach_type: u32,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> anyhow::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_encoded_bytes()).context("path")?;
    let mut attr = [0u64; 16];
    attr[0] = prog.as_raw_fd() as u64; // prog_fd, target_fd 0
    attr[1] = u64::from(attach_type); // attach_type, flags 0
    attr[2] = path.as_ptr() as u64;
    attr[3] = offsets.as_ptr() as u64;
    attr[4] = 0; // ref_ctr_offsets
    attr[5] = cookies.as_ptr() as u64;
    attr[6] = offsets.len() as u64; // cnt, flags 0
    attr[7] = u64::from(pid);
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Loads second copies of the named programs from the BPF object, as
/// session programs (`session`: expected attach type
/// BPF_TRACE_UPROBE_SESSION; the kernel only lets a session program
/// tail-call programs of the same attach type) or as uprobe_multi programs
/// (BPF_TRACE_UPROBE_MULTI); aya 0.14 can only load plain kprobe programs.
/// The copies share aya's maps: map references are relocated to `map_fds`
/// (by map name), globals to the `.rodata` map, and calls into `.text`
/// (compiler builtins such as memset) are resolved by appending the callee.
pub fn load_copies(
    object: &[u8],
    names: &[&str],
    map_fds: &HashMap<String, OwnedFd>,
    session: bool,
) -> anyhow::Result<HashMap<String, OwnedFd>> {
    let (attach_type, what) = match session {
        true => (BPF_TRACE_UPROBE_SESSION, "a session program"),
        false => (BPF_TRACE_UPROBE_MULTI, "a uprobe_multi program"),
    };
    let file = object::File::parse(object).context("parsing the BPF object")?;
    let mut loaded = HashMap::new();
    for &name in names {
        let (insns, subprograms) = relocated_program(&file, name, map_fds)
            .with_context(|| format!("relocating {name}"))?;
        let fd = load_program(&insns, name, attach_type, subprograms.as_deref())
            .with_context(|| format!("loading {name} as {what}"))?;
        loaded.insert(name.to_string(), fd);
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dispatcher_jumps_to_the_return_branch_and_ends_in_exits() {
        let p = dispatcher(7, 1234);
        // The conditional jump at index 2 lands on the return branch.
        let target = 2 + 1 + p[2].off as usize;
        assert_eq!(target, 13);
        assert_eq!((p[target].code, p[target].regs), (0xbf, 0x61)); // r1 = r6
        assert_eq!(p[1].imm, 1234);
        assert_eq!(p[1].regs >> 4, BPF_PSEUDO_KFUNC_CALL);
        // The cookie is masked to its role byte before it indexes PROGS.
        assert_eq!((p[5].code, p[5].imm), (0x57, 0xff));
        assert_eq!((p[8].code, p[8].imm), (0x18, 7));
        assert_eq!(p[12].code, 0x95);
        assert_eq!(p[19].code, 0x95);
    }
}
