use super::*;

const RDI: &[Register] = &[Register::RDI];

#[test]
fn glibc_malloc_starts_with_an_emulated_push() {
    // push r12; push rbp; push rbx
    let p = place(&[0x41, 0x54, 0x55, 0x53], RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
}

#[test]
fn glibc_free_skips_test_rdi_to_the_je() {
    // test rdi,rdi; je rel32; push rbp
    let code = [0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0, 0, 0, 0x55];
    let p = place(&code, RDI);
    assert_eq!(p.offset, 3, "{}", p.reason);
    assert!(p.reason.contains("test rdi,rdi"), "{}", p.reason);
}

#[test]
fn jemalloc_malloc_skips_cmp_to_the_ja() {
    // cmp rdi,0x1000; ja rel8
    let code = [0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x77, 0x20];
    let p = place(&code, RDI);
    assert_eq!(p.offset, 7, "{}", p.reason);
}

#[test]
fn glibc_posix_memalign_skips_a_rip_relative_cmpb() {
    // cmpb [rip+0x140201],0; push r12
    let code = [0x80, 0x3d, 0x01, 0x02, 0x14, 0x00, 0x00, 0x41, 0x54];
    let p = place(&code, &[Register::RDI, Register::RDX]);
    assert_eq!(p.offset, 7, "{}", p.reason);
}

#[test]
fn an_instruction_writing_a_read_argument_keeps_the_probe_at_the_symbol() {
    // glibc reallocarray: mov rax,rsi; mul rdx (writes rdx); mov rsi,rax; jo
    let code = [
        0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05,
    ];
    let p = place(&code, &[Register::RDI, Register::RSI, Register::RDX]);
    assert_eq!(p.offset, 0, "{}", p.reason);
    assert!(p.reason.contains("argument register"), "{}", p.reason);
    // A probe that reads only rdi may skip them.
    assert_eq!(place(&code, RDI).offset, 9);
}

#[test]
fn stack_movement_or_a_call_keeps_the_probe_at_the_symbol() {
    // sub rsp,0x18; push rbx
    let p = place(&[0x48, 0x83, 0xec, 0x18, 0x53], RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
    // mov eax,[rdi]; ret
    let p = place(&[0x8b, 0x07, 0xc3], RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
}

#[test]
fn endbr64_is_skipped() {
    // endbr64; push rbp
    let p = place(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55], RDI);
    assert_eq!(p.offset, 4, "{}", p.reason);
}

/// jemalloc 5.3's free (Debian's libjemalloc.so.2): nine straight-line
/// instructions that leave rdi alone, then `jne`.
const JEMALLOC_FREE: &[u8] = &[
    0x48, 0x89, 0xf8, // mov rax,rdi
    0x48, 0x8b, 0x15, 0x0e, 0x53, 0x0a, 0x00, // mov rdx,[rip+...]
    0x48, 0x89, 0xf9, // mov rcx,rdi
    0x48, 0xc1, 0xe8, 0x1a, // shr rax,0x1a
    0x48, 0x81, 0xe1, 0x00, 0x00, 0x00, 0xc0, // and rcx,...
    0x25, 0xf0, 0x00, 0x00, 0x00, // and eax,0xf0
    0x64, 0x48, 0x03, 0x04, 0x25, 0x00, 0x00, 0x00, 0x00, // add rax,fs:[0]
    0x48, 0x01, 0xd0, // add rax,rdx
    0x48, 0x3b, 0x88, 0xb0, 0x01, 0x00, 0x00, // cmp rcx,[rax+0x1b0]
    0x0f, 0x85, 0x8a, 0x00, 0x00, 0x00, // jne +0xc0
];

#[test]
fn jemalloc_free_skips_nine_instructions_to_the_jne() {
    let p = place(JEMALLOC_FREE, RDI);
    assert_eq!(p.offset, 0x30, "{}", p.reason);
}

#[test]
fn a_branch_back_into_the_skipped_instructions_keeps_the_probe_at_the_symbol() {
    let mut code = JEMALLOC_FREE.to_vec();
    // jmp rel8 from +0x36 back to +0x10.
    code.extend([0xeb, (0x10i32 - 0x38) as u8]);
    let p = place(&code, RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
    assert!(p.reason.contains("branches to +16"), "{}", p.reason);
    // A branch back to the symbol itself would pass a probe at the
    // symbol again too: no reason to stay there.
    let mut code = JEMALLOC_FREE.to_vec();
    code.extend([0xeb, (0i32 - 0x38) as u8]);
    assert_eq!(place(&code, RDI).offset, 0x30);
}

/// mimalloc 2.0's malloc: the heap into rdi, the size moved to rsi.
const MIMALLOC_MALLOC: &[u8] = &[
    0x48, 0x8b, 0x05, 0x49, 0xb4, 0x00, 0x00, // mov rax,[rip+...]
    0x48, 0x89, 0xfe, // mov rsi,rdi
    0x64, 0x48, 0x8b, 0x38, // mov rdi,fs:[rax]
    0x48, 0x81, 0xfe, 0x00, 0x04, 0x00, 0x00, // cmp rsi,0x400
    0x77, 0x29, // ja
];

#[test]
fn a_moved_argument_is_followed_when_the_probe_can_be_told() {
    let p = place_with(MIMALLOC_MALLOC, RDI, true);
    assert_eq!(p.offset, 21, "{}", p.reason);
    assert_eq!(p.moved, vec![(Register::RDI, Register::RSI)]);
    assert!(p.reason.contains("RDI read from RSI"), "{}", p.reason);
    // Without that, rdi's overwrite keeps the probe at the symbol.
    let p = place(MIMALLOC_MALLOC, RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
}

#[test]
fn arguments_swapped_through_other_registers_are_followed() {
    // mimalloc's realloc: mov rax,[rip]; mov rdx,rsi; mov rsi,rdi;
    // mov rax,fs:[rax]; mov rdi,rax; jmp
    let code = [
        0x48, 0x8b, 0x05, 0x49, 0xa9, 0x00, 0x00, 0x48, 0x89, 0xf2, 0x48, 0x89, 0xfe, 0x64, 0x48,
        0x8b, 0x00, 0x48, 0x89, 0xc7, 0xe9, 0xf7, 0x4e, 0xff, 0xff,
    ];
    let p = place_with(&code, &[Register::RDI, Register::RSI], true);
    assert_eq!(p.offset, 20, "{}", p.reason);
    assert_eq!(
        p.moved,
        vec![
            (Register::RDI, Register::RSI),
            (Register::RSI, Register::RDX)
        ]
    );
    // An argument overwritten without a copy cannot be followed.
    let lost = [0x48, 0x31, 0xff, 0x55]; // xor rdi,rdi; push rbp
    assert_eq!(place_with(&lost, RDI, true).offset, 0);
}

#[test]
fn nothing_emulated_in_the_window_stays_at_the_symbol() {
    // sixteen `mov eax,eax`
    let code = [0x89, 0xc0].repeat(16);
    let p = place(&code, RDI);
    assert_eq!(p.offset, 0, "{}", p.reason);
    // Truncated bytes never yield an offset past what was read.
    assert_eq!(place(&[0x48, 0x85], RDI).offset, 0);
}
