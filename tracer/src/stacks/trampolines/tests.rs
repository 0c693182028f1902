use super::*;

const BASE: u64 = 0x7f00_0000_0000;

/// An arena as CPython fills it: `size` bytes, a copy (with endbr64 or
/// not) every `stride` bytes as far as a whole copy fits, zeros between
/// and after (3.12: `mem_size / code_size` copies of 11 bytes, 9 zero
/// bytes at the end of 64 KiB; 3.13: copies padded to 16).
fn arena(size: usize, stride: usize, endbr: bool) -> Vec<u8> {
    let mut copy = if endbr { ENDBR64.to_vec() } else { Vec::new() };
    copy.extend(CODE);
    let mut bytes = vec![0u8; size];
    for k in 0..size / stride {
        let at = k * stride;
        if at + copy.len() <= size {
            bytes[at..at + copy.len()].copy_from_slice(&copy);
        }
    }
    bytes
}

fn span(from: u64, to: u64, endbr: bool, stride: u8) -> TrampolineSpan {
    TrampolineSpan {
        range: BASE + from..BASE + to,
        shape: Shape { endbr, stride },
    }
}

#[test]
fn arenas_of_3_12_and_3_13_are_one_span_each() {
    // Bytes as read from python3.12.1 and 3.13.0 -X perf on this machine.
    assert_eq!(
        recognise(&arena(65536, 11, false), BASE),
        vec![span(0, 65536, false, 11)]
    );
    assert_eq!(
        recognise(&arena(65536, 16, false), BASE),
        vec![span(0, 65536, false, 16)]
    );
    assert_eq!(
        recognise(&arena(65536, 16, true), BASE),
        vec![span(0, 65536, true, 16)]
    );
}

#[test]
fn arenas_merged_into_one_mapping_are_split_where_the_copies_restart() {
    // The kernel merges two arenas mapped next to each other into one
    // mapping. At stride 11 the second arena's first copy is off the
    // first arena's stride: two runs. At 16 the copies run on: one run,
    // described as two spans of one table each.
    let mut two = arena(65536, 11, false);
    two.extend(arena(65536, 11, false));
    assert_eq!(
        recognise(&two, BASE),
        vec![span(0, 65536, false, 11), span(65536, 131_072, false, 11)]
    );
    let mut two = arena(65536, 16, false);
    two.extend(arena(65536, 16, false));
    assert_eq!(
        recognise(&two, BASE),
        vec![span(0, 65536, false, 16), span(65536, 131_072, false, 16)]
    );
}

#[test]
fn other_code_is_not_trampolines() {
    // V8-like code with a frame pointer, zeros, a copy with other code after
    // it, a copy cut short.
    let prologue = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x08];
    assert!(recognise(&prologue, BASE).is_empty());
    assert!(recognise(&[0u8; 4096], BASE).is_empty());
    let mut mixed = arena(4096, 16, false);
    mixed[2000] = 0xcc;
    assert!(recognise(&mixed, BASE).is_empty());
    assert!(recognise(&CODE[..10], BASE).is_empty());
    // A zero page before the copies: not an arena's start.
    let mut late = vec![0u8; 4096];
    late.extend(arena(4096, 16, false));
    assert!(recognise(&late, BASE).is_empty());
}

#[test]
fn the_table_says_what_cfa_offset_says_at_every_byte() {
    for shape in [
        Shape {
            endbr: false,
            stride: 11,
        },
        Shape {
            endbr: false,
            stride: 16,
        },
        Shape {
            endbr: true,
            stride: 16,
        },
    ] {
        let table = shape.table();
        assert_eq!(table.rows.len() as u64, 2 * shape.copies() + 1);
        assert!(table.encoded().is_ok());
        for off in 0..TABLE_SPAN {
            let want = Rule {
                cfa: Cfa::Sp(shape.cfa_offset(off) as i32),
                fp: Fp::Same,
            };
            assert_eq!(table.lookup(off), Some(want), "{shape:?} at {off}");
        }
    }
}

#[test]
fn at_the_call_the_return_address_is_above_one_slot() {
    // The walker looks rows up at return address - 1: inside the call.
    let plain = Shape {
        endbr: false,
        stride: 11,
    };
    let call_site = 11 * 7 + 4 + 1;
    assert_eq!(plain.cfa_offset(call_site), 16);
    assert_eq!(plain.cfa_offset(11 * 7), 8); // entry
    assert_eq!(plain.cfa_offset(11 * 7 + 10), 8); // ret
    let cet = Shape {
        endbr: true,
        stride: 16,
    };
    assert_eq!(cet.cfa_offset(16 * 3 + 4 + 4 + 1), 16);
    assert_eq!(cet.cfa_offset(16 * 3 + 2), 8);
}

#[test]
fn only_ranges_new_since_the_last_update_are_read() {
    let a = BASE..BASE + 65536;
    let b = BASE + 0x0010_0000..BASE + 0x0011_0000;
    let mut reads = Vec::new();
    let mut jit = JitCode::default();
    let read = |reads: &mut Vec<Range<u64>>, r: &Range<u64>| {
        reads.push(r.clone());
        if r.start == BASE {
            vec![span(0, 65536, false, 11)]
        } else {
            Vec::new()
        }
    };
    assert!(jit.update_with(vec![a.clone()], |r| read(&mut reads, r)));
    assert!(!jit.update_with(vec![a.clone()], |r| read(&mut reads, r)));
    assert!(jit.update_with(vec![a.clone(), b.clone()], |r| read(&mut reads, r)));
    assert_eq!(reads, vec![a.clone(), b.clone()]);
    assert_eq!(jit.trampolines(), &[span(0, 65536, false, 11)]);
    assert_eq!(
        jit.trampoline_at(BASE + 100),
        Some(&span(0, 65536, false, 11))
    );
    assert_eq!(jit.trampoline_at(BASE + 65536), None);
    assert_eq!(jit.trampoline_at(b.start), None);
    // `a` grown (another arena merged below it): read again.
    let grown = BASE - 65536..BASE + 65536;
    assert!(jit.update_with(vec![grown.clone(), b], |r| read(&mut reads, r)));
    assert_eq!(reads.last(), Some(&grown));
    assert!(jit.trampolines().is_empty());
}

#[test]
fn a_process_s_own_trampolines_are_found_in_its_memory() {
    // This process maps an arena as CPython does and reads it back
    // through /proc/self/mem, as the tracer reads a traced process's.
    let size = 65536;
    // SAFETY: a fresh private anonymous mapping, written and unmapped
    // here only.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let bytes = arena(size, 16, false);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), size);
        assert_eq!(
            libc::mprotect(p, size, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
        let start = p as u64;
        let found = read(std::process::id(), &(start..start + size as u64));
        libc::munmap(p, size);
        assert_eq!(
            found,
            vec![TrampolineSpan {
                range: start..start + size as u64,
                shape: Shape {
                    endbr: false,
                    stride: 16
                },
            }]
        );
    }
}
