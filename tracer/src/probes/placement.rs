//! Where on a function to put its probes.
//!
//! A uprobe costs about 1 µs when the kernel can emulate the instruction it
//! replaces (push of a register, jmp/jcc/call with a relative target, nop)
//! and 10–19 µs when it must single-step it out of line (measured on a 6.18 host;
//! arch/x86/kernel/uprobes.c). So the entry probe goes on the first
//! emulated instruction, provided that every instruction before it
//!
//! - is straight-line (no branch, call or return),
//! - does not move the stack pointer, and
//! - does not write a register holding an argument the probe reads,
//!
//! and no branch in the function targets the skipped instructions or the
//! probe's own (a loop back there would fire the entry probe twice).
//!
//! Then, at the probe, the arguments and the stack pointer are what they
//! were at the function's entry, and `[rsp]` still holds the return address,
//! so the return probe can sit at the same offset. Otherwise both stay at
//! the symbol (offset 0).

use std::fmt::Write as _;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Formatter as _, Instruction,
    InstructionInfoFactory, IntelFormatter, OpAccess, Register,
};

/// How far past the symbol the search goes. jemalloc's free computes its
/// thread-cache lookup in nine straight-line instructions before its first
/// branch; a shorter search left it single-stepped (12x slower redis).
const MAX_INSTRUCTIONS: usize = 16;
/// Bytes of code read at each symbol when its size is unknown, and most
/// bytes the search for the probe's instruction looks at.
pub const WINDOW: usize = 96;
/// Most bytes of a function read to check that no branch targets the
/// skipped instructions.
pub const MAX_FUNCTION: usize = 1 << 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Offset from the symbol of the entry and return probes.
    pub offset: u64,
    /// Why, for --verbose and the JSON report.
    pub reason: String,
    /// Arguments the skipped instructions moved: (the ABI register that
    /// held it at entry, where it is at the probe). Only when `place` was
    /// allowed to (the probe learns it from its attach cookie).
    pub moved: Vec<(Register, Register)>,
}

/// The argument registers in System V order.
pub const ARG_REGISTERS: [Register; 3] = [Register::RDI, Register::RSI, Register::RDX];

/// Chooses the probe offset for a function whose code is `code` (the whole
/// function when its size is known, else its first WINDOW bytes), whose
/// probe reads the argument registers `args`.
pub fn place(code: &[u8], args: &[Register]) -> Placement {
    place_with(code, args, false)
}

/// `place`, allowing the skipped instructions to move a read argument to
/// another register (mimalloc's malloc: `mov rsi,rdi` before its first
/// branch), when the probe can be told where it went.
pub fn place_with(code: &[u8], args: &[Register], may_move: bool) -> Placement {
    let found = first_emulated(&code[..code.len().min(WINDOW)], args, may_move);
    if found.offset == 0 {
        return found;
    }
    match branch_into(code, found.offset) {
        Some((from, to)) => at_symbol(format!(
            "the instruction at +{from} branches to +{to}, at or before the emulated one at +{}",
            found.offset
        )),
        None => found,
    }
}

/// A branch in `code` (from, to) whose target lies in 1..=`upto`.
fn branch_into(code: &[u8], upto: u64) -> Option<(u64, u64)> {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    while decoder.can_decode() {
        let instr = decoder.decode();
        if instr.is_invalid() {
            continue;
        }
        let direct = matches!(
            instr.flow_control(),
            FlowControl::UnconditionalBranch
                | FlowControl::ConditionalBranch
                | FlowControl::Call
                | FlowControl::XbeginXabortXend
        );
        if direct && instr.near_branch_target() != 0 {
            let to = instr.near_branch_target();
            if (1..=upto).contains(&to) {
                return Some((instr.ip(), to));
            }
        }
    }
    None
}

fn first_emulated(code: &[u8], args: &[Register], may_move: bool) -> Placement {
    let mut decoder = Decoder::with_ip(64, code, 0, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut skipped = String::new();
    // Which entry argument each register holds now.
    let mut holds: Vec<(Register, Register)> = args.iter().map(|&a| (a, a)).collect();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        let instr = decoder.decode();
        if instr.is_invalid() || instr.next_ip() > code.len() as u64 {
            break; // ran off the bytes we read
        }
        let text = disassemble(&instr);
        if emulated(&instr) {
            let mut moved = Vec::new();
            for &a in args {
                if holds.iter().any(|&(r, v)| r == a && v == a) {
                    continue;
                }
                match holds.iter().find(|&&(_, v)| v == a) {
                    Some(&(r, _)) => moved.push((a, r)),
                    None => {
                        return at_symbol(format!(
                            "the skipped instructions overwrite {a:?}, an argument the probe reads"
                        ))
                    }
                }
            }
            let mut reason = if instr.ip() == 0 {
                format!("symbol: `{text}` is emulated")
            } else {
                format!("+{}: `{text}` is emulated; skipped {skipped}", instr.ip())
            };
            for (from, to) in &moved {
                let _ = write!(reason, "; {from:?} read from {to:?}");
            }
            return Placement {
                offset: instr.ip(),
                reason,
                moved,
            };
        }
        let guarded: &[Register] = if may_move { &[] } else { args };
        if let Some(why) = blocks_skipping(&instr, guarded, &mut info) {
            return at_symbol(format!("`{text}` at +{} {why}", instr.ip()));
        }
        track_moves(&instr, &mut holds, &mut info);
        if !skipped.is_empty() {
            skipped.push_str(", ");
        }
        let _ = write!(skipped, "`{text}`");
    }
    at_symbol(format!(
        "no emulated instruction in the first {MAX_INSTRUCTIONS} instructions"
    ))
}

fn at_symbol(why: String) -> Placement {
    Placement {
        offset: 0,
        reason: format!("symbol (single-stepped): {why}"),
        moved: Vec::new(),
    }
}

/// Updates which entry argument each register holds after `instr`: a
/// 64-bit register-to-register mov copies it; any other write loses it.
fn track_moves(
    instr: &Instruction,
    holds: &mut Vec<(Register, Register)>,
    info: &mut InstructionInfoFactory,
) {
    let copy = matches!(instr.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
        && instr.op0_kind() == iced_x86::OpKind::Register
        && instr.op1_kind() == iced_x86::OpKind::Register;
    let copied = if copy {
        holds
            .iter()
            .find(|&&(r, _)| r == instr.op1_register())
            .map(|&(_, v)| v)
    } else {
        None
    };
    for used in info.info(instr).used_registers() {
        if matches!(
            used.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) {
            let reg = used.register().full_register();
            holds.retain(|&(r, _)| r != reg);
        }
    }
    if let Some(value) = copied {
        holds.push((instr.op0_register(), value));
    }
}

/// Instructions the x86 uprobe code emulates instead of single-stepping:
/// push of a 64-bit register, jmp rel8/rel32, jcc rel8/rel32, call rel32
/// and the one-byte nop (arch/x86/kernel/uprobes.c: push_setup_xol_ops,
/// branch_setup_xol_ops).
fn emulated(instr: &Instruction) -> bool {
    match instr.code() {
        Code::Push_r64 => true,
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 => true,
        Code::Nopd | Code::Nopw | Code::Nopq => instr.len() <= 2,
        _ => instr.is_jcc_short_or_near(),
    }
}

/// Why the probe may not be placed after `instr`, if it may not.
fn blocks_skipping(
    instr: &Instruction,
    args: &[Register],
    info: &mut InstructionInfoFactory,
) -> Option<&'static str> {
    if instr.flow_control() != FlowControl::Next {
        return Some("changes control flow");
    }
    if instr.stack_pointer_increment() != 0 {
        return Some("moves the stack pointer");
    }
    for used in info.info(instr).used_registers() {
        let writes = matches!(
            used.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        );
        if !writes {
            continue;
        }
        let reg = used.register().full_register();
        if reg == Register::RSP {
            return Some("writes the stack pointer");
        }
        if args.contains(&reg) {
            return Some("writes an argument register the probe reads");
        }
    }
    None
}

fn disassemble(instr: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(instr, &mut out);
    out
}

#[cfg(test)]
mod tests;
