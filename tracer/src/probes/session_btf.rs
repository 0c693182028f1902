//! The smallest BTF that lets the kernel load a program with subprograms
//! as aya loads its own with the object's BTF: the verifier wants
//! `func_info` (one function per subprogram) as soon as a program takes a
//! function's address ("missing btf func_info"), and checks a subprogram
//! on its own, once, only where `func_info` says it is global. The session
//! copies (`uprobe_session.rs`) are loaded by hand, so they get this: a
//! prototype without parameters for static functions (verified in their
//! caller's context, so their parameters are not checked), a `long (long, ...)`
//! one for global functions (whose parameters are integers, see
//! kernel_btf::global_function_params), and one function per subprogram.

use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::Context as _;

const BTF_MAGIC: u16 = 0xeb9f;
const BTF_KIND_INT: u32 = 1;
const BTF_KIND_FUNC: u32 = 12;
const BTF_KIND_FUNC_PROTO: u32 = 13;
const BPF_BTF_LOAD: libc::c_long = 18;

/// A loaded BTF object and the `func_info` records (instruction index,
/// type id) of a program whose subprograms start at `starts` (the main
/// program at 0 first, each with whether it is global).
pub struct FuncInfo {
    pub btf: OwnedFd,
    pub records: Vec<[u32; 2]>,
}

/// The BTF blob: a prototype `void (void)` (id 1), `long` (id 2), then a
/// function `f<i>` per subprogram, static of prototype 1, or global of a
/// prototype `long (long, ...)` with its parameters, given just before it.
fn blob(globals: &[Option<u32>]) -> Vec<u8> {
    // Parameters of a global function need names: all are "a".
    let mut strings = b"\0long\0a\0".to_vec();
    const PARAM_NAME: u32 = 6;
    let mut types: Vec<u32> = vec![
        0,
        BTF_KIND_FUNC_PROTO << 24,
        0,
        // long: 8 bytes; encoding signed (bit 24), 64 bits.
        1,
        BTF_KIND_INT << 24,
        8,
        (1 << 24) | 64,
    ];
    let mut next_id = 3;
    for (i, global) in globals.iter().enumerate() {
        let name_off = strings.len() as u32;
        strings.extend_from_slice(format!("f{i}\0").as_bytes());
        // info: kind in bits 24-28, linkage (0 static, 1 global) in vlen.
        match *global {
            None => types.extend([name_off, BTF_KIND_FUNC << 24, 1]),
            Some(params) => {
                // The prototype: returns long (2); each parameter a long.
                types.extend([0, (BTF_KIND_FUNC_PROTO << 24) | params, 2]);
                for _ in 0..params {
                    types.extend([PARAM_NAME, 2]);
                }
                types.extend([name_off, (BTF_KIND_FUNC << 24) | 1, next_id]);
                next_id += 1;
            }
        }
        next_id += 1;
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
pub fn load(starts: &[(usize, Option<u32>)]) -> anyhow::Result<FuncInfo> {
    let globals: Vec<Option<u32>> = starts.iter().map(|&(_, global)| global).collect();
    let blob = blob(&globals);
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
                "loading BTF for a program's subprograms: {}",
                String::from_utf8_lossy(&log[..end]).trim()
            )
        });
    }
    // SAFETY: a new fd that we own.
    let btf = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // Each function's id: after those before it and their prototypes.
    let mut id = 2;
    let records = starts
        .iter()
        .map(|&(start, global)| {
            id += if global.is_some() { 2 } else { 1 };
            [start as u32, id]
        })
        .collect();
    Ok(FuncInfo { btf, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_has_prototypes_and_one_function_per_subprogram() {
        let b = blob(&[None, Some(1)]);
        assert_eq!(&b[..4], &[0x9f, 0xeb, 1, 0]);
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let (type_len, str_len) = (word(12), word(20));
        // void(void) 12, long 16, f0 12, long(long) 12 + 8, f1 12.
        assert_eq!(type_len, 12 + 16 + 12 + 20 + 12);
        assert_eq!(b.len(), 24 + type_len as usize + str_len as usize);
        let strings = 24 + type_len as usize;
        // Id 3, f0: static, of prototype 1.
        let f0 = 24 + 12 + 16;
        assert_eq!((word(f0 + 4), word(f0 + 8)), (BTF_KIND_FUNC << 24, 1));
        // Id 4: one parameter, returning long (2); the parameter a long.
        let proto = f0 + 12;
        assert_eq!(
            (word(proto + 4), word(proto + 8)),
            ((BTF_KIND_FUNC_PROTO << 24) | 1, 2)
        );
        assert_eq!(word(proto + 16), 2);
        let param = word(proto + 12) as usize;
        assert_eq!(&b[strings + param..strings + param + 2], b"a\0");
        // Id 5, f1: global, of prototype 4.
        let f1 = proto + 20;
        assert_eq!((word(f1 + 4), word(f1 + 8)), ((BTF_KIND_FUNC << 24) | 1, 4));
        let name = word(f1) as usize;
        assert_eq!(&b[strings + name..strings + name + 3], b"f1\0");
    }
}
