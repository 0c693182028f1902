//! The smallest BTF that lets the kernel load a program whose subprogram is
//! a `bpf_loop` callback: the verifier wants `func_info` (one static
//! function per subprogram) as soon as a program takes a function's address
//! ("missing btf func_info"). aya loads its own programs with the object's
//! BTF; the session copies (`uprobe_session.rs`) are loaded by hand, so
//! they get this: one prototype without parameters and one static function
//! per subprogram. Static subprograms are verified in their caller's
//! context, so the prototype's (absent) parameters are not checked.

use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::Context as _;

const BTF_MAGIC: u16 = 0xeb9f;
const BTF_KIND_FUNC: u32 = 12;
const BTF_KIND_FUNC_PROTO: u32 = 13;
const BPF_BTF_LOAD: libc::c_long = 18;

/// A loaded BTF object and the `func_info` records (instruction index,
/// type id) of a program whose subprograms start at `starts` (the main
/// program at 0 first).
pub struct FuncInfo {
    pub btf: OwnedFd,
    pub records: Vec<[u32; 2]>,
}

/// The BTF blob: a prototype `void (void)` (id 1), then a static function
/// `f<i>` of that prototype per subprogram (ids 2..).
fn blob(functions: usize) -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut types: Vec<u32> = vec![0, BTF_KIND_FUNC_PROTO << 24, 0];
    for i in 0..functions {
        let name_off = strings.len() as u32;
        strings.extend_from_slice(format!("f{i}\0").as_bytes());
        // info: kind in bits 24-28, linkage (0 = static) in vlen.
        types.extend([name_off, BTF_KIND_FUNC << 24, 1]);
    }
    let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
    let mut out = Vec::new();
    out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
    out.extend_from_slice(&[1, 0]); // version, flags
    for word in [24u32, 0, type_bytes.len() as u32, type_bytes.len() as u32] {
        out.extend_from_slice(&word.to_le_bytes()); // hdr_len, type_off, type_len, str_off
    }
    out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
    out.extend_from_slice(&type_bytes);
    out.extend_from_slice(&strings);
    out
}

/// Loads the BTF for subprograms starting at `starts` (sorted, 0 first).
pub fn load(starts: &[usize]) -> anyhow::Result<FuncInfo> {
    let blob = blob(starts.len());
    let mut log = vec![0u8; 64 << 10];
    let mut attr = [0u64; 16];
    attr[0] = blob.as_ptr() as u64;
    attr[1] = log.as_mut_ptr() as u64;
    attr[2] = blob.len() as u64 | ((log.len() as u64) << 32); // btf_size, btf_log_size
    attr[3] = 1; // btf_log_level
                 // SAFETY: `attr` is a zero-padded bpf_attr; its pointers point to live
                 // buffers of the sizes given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_BTF_LOAD,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr) as libc::c_uint,
        )
    };
    if fd < 0 {
        let end = log.iter().position(|&b| b == 0).unwrap_or(0);
        return Err(std::io::Error::last_os_error()).with_context(|| {
            format!(
                "loading BTF for a bpf_loop callback: {}",
                String::from_utf8_lossy(&log[..end]).trim()
            )
        });
    }
    // SAFETY: a new fd that we own.
    let btf = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let records = starts
        .iter()
        .enumerate()
        .map(|(i, &start)| [start as u32, i as u32 + 2])
        .collect();
    Ok(FuncInfo { btf, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_has_a_header_a_prototype_and_one_function_per_subprogram() {
        let b = blob(2);
        assert_eq!(&b[..4], &[0x9f, 0xeb, 1, 0]);
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let (type_len, str_len) = (word(12), word(20));
        assert_eq!(type_len, 3 * 12);
        assert_eq!(b.len(), 24 + type_len as usize + str_len as usize);
        // The second function: kind FUNC, static, of prototype 1, named "f1".
        assert_eq!(
            (word(24 + 24 + 4), word(24 + 24 + 8)),
            (BTF_KIND_FUNC << 24, 1)
        );
        let name = word(24 + 24) as usize;
        assert_eq!(&b[24 + 36 + name..24 + 36 + name + 3], b"f1\0");
    }
}
