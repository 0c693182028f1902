//! Reading an entry probe's arguments: from the ABI registers, or where
//! the attach cookie says a session probe placed past the function's entry
//! finds them (see tracer_common::cookie).

use aya_ebpf::programs::ProbeContext;
use tracer_common::cookie;

use crate::maps::{tunable, ATTACH_COOKIES};

#[inline(always)]
pub(crate) fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// The arguments of an entry probe as they were at the function's entry.
/// A session probe placed past instructions that moved an argument (see
/// tracer_common::cookie) finds it where its attach cookie says; plain
/// uprobes have no cookie (0) and read the ABI registers.
pub(crate) struct Args<'a> {
    ctx: &'a ProbeContext,
    cookie: u64,
}

impl<'a> Args<'a> {
    #[inline(always)]
    pub(crate) fn of(ctx: &'a ProbeContext) -> Self {
        // Kernels before 5.15 have no bpf_get_attach_cookie (and no
        // sessions, the only probes with cookies): the call is left out
        // there, as a branch on a load-time constant the verifier skips.
        let cookie = if tunable(&ATTACH_COOKIES) != 0 {
            // SAFETY: the helper reads the attach cookie of the running probe.
            unsafe { aya_ebpf::helpers::generated::bpf_get_attach_cookie(ctx.regs.cast()) }
        } else {
            0
        };
        Args { ctx, cookie }
    }

    #[inline(always)]
    pub(crate) fn get(&self, n: usize) -> u64 {
        let at = (self.cookie >> (cookie::ARG_SHIFT as usize + 4 * n)) & 0xf;
        if at == 0 {
            return arg(self.ctx, n);
        }
        let regs = self.ctx.regs;
        // Each field is loaded at its constant offset: the verifier refuses
        // a load from the context at a computed one, which is what a match
        // over the fields compiles to.
        // SAFETY: the context is pt_regs, readable directly.
        let r = unsafe {
            use core::ptr::read_volatile as rd;
            [
                rd(&(*regs).rdi),
                rd(&(*regs).rsi),
                rd(&(*regs).rdx),
                rd(&(*regs).rcx),
                rd(&(*regs).r8),
                rd(&(*regs).r9),
                rd(&(*regs).rax),
                rd(&(*regs).r10),
                rd(&(*regs).r11),
            ]
        };
        match at {
            cookie::RDI => r[0],
            cookie::RSI => r[1],
            cookie::RDX => r[2],
            cookie::RCX => r[3],
            cookie::R8 => r[4],
            cookie::R9 => r[5],
            cookie::RAX => r[6],
            cookie::R10 => r[7],
            cookie::R11 => r[8],
            _ => 0,
        }
    }
}
