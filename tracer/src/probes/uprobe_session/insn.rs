//! The BPF instruction as bpf(2) takes it, and the few the dispatcher is
//! assembled from.

use std::os::fd::RawFd;

pub(super) const BPF_PSEUDO_MAP_FD: u8 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Insn {
    pub(super) code: u8,
    pub(super) regs: u8,
    pub(super) off: i16,
    pub(super) imm: i32,
}

pub(super) const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

pub(super) fn mov_reg(dst: u8, src: u8) -> Insn {
    insn(0xbf, dst, src, 0, 0) // BPF_ALU64 | BPF_MOV | BPF_X
}

pub(super) fn mov_imm(dst: u8, imm: i32) -> Insn {
    insn(0xb7, dst, 0, 0, imm) // BPF_ALU64 | BPF_MOV | BPF_K
}

pub(super) fn call(src: u8, imm: i32) -> Insn {
    insn(0x85, 0, src, 0, imm) // BPF_JMP | BPF_CALL
}

pub(super) fn ld_map_fd(dst: u8, fd: RawFd) -> [Insn; 2] {
    [
        insn(0x18, dst, BPF_PSEUDO_MAP_FD, 0, fd), // BPF_LD | BPF_IMM | BPF_DW
        insn(0, 0, 0, 0, 0),
    ]
}

pub(super) const EXIT: Insn = insn(0x95, 0, 0, 0, 0);
