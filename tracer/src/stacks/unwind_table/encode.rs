//! The 8-byte row encoding the BPF walker reads (docs/unwind-tables.md,
//! "Row encoding"): `(pc - base) << 32 | rule word`.

#[cfg(test)]
use super::Unsupported;
use super::{Cfa, Fp, Rule, CFA_OFF_BITS, FP_OFF_BITS};

/// Rule kinds as stored in a row's low 4 bits.
const KIND_SP: u32 = 0;
const KIND_FP: u32 = 1;
const KIND_DEREF_SP: u32 = 2;
const KIND_DEREF_FP: u32 = 3;
const KIND_PLT: u32 = 4;
const KIND_SIGNAL: u32 = 5;
const KIND_OUTERMOST: u32 = 6;
const KIND_NO_INFO: u32 = 7;
/// 8 + `Unsupported` as number.
const KIND_UNSUPPORTED: u32 = 8;

/// Saved-RBP rules as stored in bits 4-5.
const FP_SAME: u32 = 0;
const FP_AT_CFA: u32 = 1;
const FP_LOST: u32 = 2;

/// The 32-bit rule word: kind (bits 0-3), RBP rule (4-5), RBP offset / 8
/// (6-11, signed), CFA offset / 8 (12-31, signed). A PLT row keeps its
/// threshold in the CFA offset field.
pub(super) fn encode_rule(rule: Rule) -> u32 {
    let field = |v: i32, bits: u32| (v >> 3) as u32 & ((1 << bits) - 1);
    let (kind, cfa_off) = match rule.cfa {
        Cfa::Sp(o) => (KIND_SP, field(o, CFA_OFF_BITS)),
        Cfa::Fp(o) => (KIND_FP, field(o, CFA_OFF_BITS)),
        Cfa::DerefSp(o) => (KIND_DEREF_SP, field(o, CFA_OFF_BITS)),
        Cfa::DerefFp(o) => (KIND_DEREF_FP, field(o, CFA_OFF_BITS)),
        Cfa::Plt { threshold } => (KIND_PLT, u32::from(threshold)),
        Cfa::Signal => (KIND_SIGNAL, 0),
        Cfa::Outermost => (KIND_OUTERMOST, 0),
        Cfa::NoInfo => (KIND_NO_INFO, 0),
        Cfa::Unsupported(why) => (KIND_UNSUPPORTED + why as u32, 0),
    };
    let (fp, fp_off) = match rule.fp {
        Fp::Same => (FP_SAME, 0),
        Fp::AtCfa(o) => (FP_AT_CFA, field(o, FP_OFF_BITS)),
        Fp::Lost => (FP_LOST, 0),
    };
    kind | fp << 4 | fp_off << 6 | cfa_off << 12
}

/// The inverse of `encode_rule`, as the BPF walker reads a row
/// (tracer-ebpf/src/walk.rs); the tests check the encoding with it.
#[cfg(test)]
pub(crate) fn decode_rule(word: u32) -> Option<Rule> {
    // Sign-extends the `bits`-bit field at `shift` and scales it by 8.
    let signed = |shift: u32, bits: u32| ((word << (32 - shift - bits)) as i32 >> (32 - bits)) * 8;
    let cfa_off = signed(12, CFA_OFF_BITS);
    let cfa = match word & 0xf {
        KIND_SP => Cfa::Sp(cfa_off),
        KIND_FP => Cfa::Fp(cfa_off),
        KIND_DEREF_SP => Cfa::DerefSp(cfa_off),
        KIND_DEREF_FP => Cfa::DerefFp(cfa_off),
        KIND_PLT => Cfa::Plt {
            threshold: u8::try_from(word >> 12).ok()?,
        },
        KIND_SIGNAL => Cfa::Signal,
        KIND_OUTERMOST => Cfa::Outermost,
        KIND_NO_INFO => Cfa::NoInfo,
        8 => Cfa::Unsupported(Unsupported::CfaRegister),
        9 => Cfa::Unsupported(Unsupported::CfaExpression),
        10 => Cfa::Unsupported(Unsupported::ReturnAddress),
        11 => Cfa::Unsupported(Unsupported::Offset),
        _ => return None,
    };
    let fp = match (word >> 4) & 3 {
        FP_SAME => Fp::Same,
        FP_AT_CFA => Fp::AtCfa(signed(6, FP_OFF_BITS)),
        FP_LOST => Fp::Lost,
        _ => return None,
    };
    Some(Rule { cfa, fp })
}
