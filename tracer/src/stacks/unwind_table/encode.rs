//! A `Rule` as the rule word of a row the BPF walker reads, and back,
//! through `tracer_common::unwind_row`: the layout is defined there,
//! once, for both sides.

#[cfg(test)]
use tracer_common::unwind_row as w;
use tracer_common::unwind_row::{
    offset_field, rule_word, CFA_OFF_BITS, FP_AT_CFA, FP_LOST, FP_OFF_BITS, FP_SAME, KIND_DEREF_FP,
    KIND_DEREF_SP, KIND_FP, KIND_NO_INFO, KIND_OUTERMOST, KIND_PLT, KIND_SIGNAL, KIND_SP,
    KIND_UNSUPPORTED,
};

#[cfg(test)]
use super::Unsupported;
use super::{Cfa, Fp, Rule};

/// The 32-bit rule word of `rule` (offsets were checked to fit when the
/// rule was made).
pub(super) fn encode_rule(rule: Rule) -> u32 {
    let cfa = |o: i32| offset_field(o, CFA_OFF_BITS);
    let (kind, cfa_field) = match rule.cfa {
        Cfa::Sp(o) => (KIND_SP, cfa(o)),
        Cfa::Fp(o) => (KIND_FP, cfa(o)),
        Cfa::DerefSp(o) => (KIND_DEREF_SP, cfa(o)),
        Cfa::DerefFp(o) => (KIND_DEREF_FP, cfa(o)),
        Cfa::Plt { threshold } => (KIND_PLT, u32::from(threshold)),
        Cfa::Signal => (KIND_SIGNAL, 0),
        Cfa::Outermost => (KIND_OUTERMOST, 0),
        Cfa::NoInfo => (KIND_NO_INFO, 0),
        Cfa::Unsupported(why) => (KIND_UNSUPPORTED + why as u32, 0),
    };
    let (fp, fp_field) = match rule.fp {
        Fp::Same => (FP_SAME, 0),
        Fp::AtCfa(o) => (FP_AT_CFA, offset_field(o, FP_OFF_BITS)),
        Fp::Lost => (FP_LOST, 0),
    };
    rule_word(kind, cfa_field, fp, fp_field)
}

/// The inverse of `encode_rule`, read with the accessors the BPF walker
/// uses (tracer-ebpf/src/walk.rs); the tests check the encoding with it.
#[cfg(test)]
pub(crate) fn decode_rule(word: u32) -> Option<Rule> {
    let cfa_off = i32::try_from(w::cfa_offset(word)).ok()?;
    let cfa = match w::kind(word) {
        KIND_SP => Cfa::Sp(cfa_off),
        KIND_FP => Cfa::Fp(cfa_off),
        KIND_DEREF_SP => Cfa::DerefSp(cfa_off),
        KIND_DEREF_FP => Cfa::DerefFp(cfa_off),
        KIND_PLT => Cfa::Plt {
            threshold: u8::try_from(w::plt_threshold(word)).ok()?,
        },
        KIND_SIGNAL => Cfa::Signal,
        KIND_OUTERMOST => Cfa::Outermost,
        KIND_NO_INFO => Cfa::NoInfo,
        k => Cfa::Unsupported(match k - KIND_UNSUPPORTED {
            0 => Unsupported::CfaRegister,
            1 => Unsupported::CfaExpression,
            2 => Unsupported::ReturnAddress,
            3 => Unsupported::Offset,
            _ => return None,
        }),
    };
    let fp = match w::fp_rule(word) {
        FP_SAME => Fp::Same,
        FP_AT_CFA => Fp::AtCfa(i32::try_from(w::fp_offset(word)).ok()?),
        FP_LOST => Fp::Lost,
        _ => return None,
    };
    Some(Rule { cfa, fp })
}
