//! One row of the unwind tables in UNWIND_ROWS (docs/unwind-tables.md,
//! "Row encoding"): user space encodes rows with these functions, the BPF
//! walker decodes them with the same ones.
//!
//! ```text
//! u64 row = (pc - table.base) << 32 | rule
//! rule bits  0-3  CFA kind (KIND_*)
//!            4-5  RBP rule (FP_*)
//!            6-11 RBP offset / 8, signed      (CFA-256 .. CFA+248)
//!           12-31 CFA offset / 8, signed      (±4 MiB); a PLT row keeps its
//!                 threshold here
//! ```
//!
//! The address is in the high half so that the words sort as the
//! addresses do.

/// Bytes per encoded row.
pub const ROW_BYTES: usize = 8;

/// Signed bits of the CFA offset field (in units of 8 bytes).
pub const CFA_OFF_BITS: u32 = 20;
/// Signed bits of the saved-RBP offset field (in units of 8 bytes).
pub const FP_OFF_BITS: u32 = 6;

/// CFA = RSP + offset.
pub const KIND_SP: u32 = 0;
/// CFA = RBP + offset.
pub const KIND_FP: u32 = 1;
/// CFA = *(RSP + offset).
pub const KIND_DEREF_SP: u32 = 2;
/// CFA = *(RBP + offset).
pub const KIND_DEREF_FP: u32 = 3;
/// A PLT entry: CFA = RSP + 8, plus 8 once `(RIP & 15) >= threshold`.
pub const KIND_PLT: u32 = 4;
/// A signal trampoline: the interrupted registers are in the
/// `ucontext_t` at RSP.
pub const KIND_SIGNAL: u32 = 5;
/// The outermost frame: the stack is complete.
pub const KIND_OUTERMOST: u32 = 6;
/// No unwind information here: take a frame-pointer step.
pub const KIND_NO_INFO: u32 = 7;
/// A rule the walker cannot follow: `KIND_UNSUPPORTED + reason` (the
/// reasons 0 to 3 are user space's `Unsupported`).
pub const KIND_UNSUPPORTED: u32 = 8;

/// RBP is unchanged in the caller.
pub const FP_SAME: u32 = 0;
/// The caller's RBP is saved at CFA + the RBP offset.
pub const FP_AT_CFA: u32 = 1;
/// The caller's RBP is not known.
pub const FP_LOST: u32 = 2;

/// The row of a rule word from `rel_pc` (the address less the table's
/// base) on.
#[inline(always)]
pub const fn row(rel_pc: u32, rule: u32) -> u64 {
    (rel_pc as u64) << 32 | rule as u64
}

/// A row's address, relative to its table's base.
#[inline(always)]
pub const fn row_pc(row: u64) -> u32 {
    (row >> 32) as u32
}

/// A row's rule word.
#[inline(always)]
pub const fn row_rule(row: u64) -> u32 {
    row as u32
}

/// A signed offset in bytes as a `bits`-bit field of units of 8 (the
/// caller checks it is a multiple of 8 that fits: `offset_fits`).
#[inline(always)]
pub const fn offset_field(offset: i32, bits: u32) -> u32 {
    (offset >> 3) as u32 & ((1 << bits) - 1)
}

/// Whether `offset` is a multiple of 8 that fits a `bits`-bit field.
pub const fn offset_fits(offset: i64, bits: u32) -> bool {
    let limit = 8i64 << (bits - 1);
    offset % 8 == 0 && offset >= -limit && offset < limit
}

/// The rule word of a CFA kind and its field (`offset_field` of the CFA
/// offset, or a PLT row's threshold), and an RBP rule and its field.
#[inline(always)]
pub const fn rule_word(kind: u32, cfa_field: u32, fp_rule: u32, fp_field: u32) -> u32 {
    kind | fp_rule << 4 | fp_field << 6 | cfa_field << 12
}

/// The CFA kind of a rule word (`KIND_*`).
#[inline(always)]
pub const fn kind(rule: u32) -> u32 {
    rule & 0xf
}

/// The RBP rule of a rule word (`FP_*`).
#[inline(always)]
pub const fn fp_rule(rule: u32) -> u32 {
    (rule >> 4) & 3
}

/// The CFA offset of a rule word, in bytes.
#[inline(always)]
pub const fn cfa_offset(rule: u32) -> i64 {
    ((rule as i32) >> 12) as i64 * 8
}

/// The saved-RBP offset of a rule word, in bytes.
#[inline(always)]
pub const fn fp_offset(rule: u32) -> i64 {
    (((rule << 20) as i32) >> 26) as i64 * 8
}

/// A PLT row's threshold (the whole CFA field, unsigned).
#[inline(always)]
pub const fn plt_threshold(rule: u32) -> u32 {
    rule >> 12
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_at_the_ends_of_their_fields() {
        let cfa_limit = 8 << (CFA_OFF_BITS - 1);
        let fp_limit = 8 << (FP_OFF_BITS - 1);
        for cfa in [-cfa_limit, -8, 0, 8, 16, 1 << 20, cfa_limit - 8] {
            for fp in [-fp_limit, -16, 0, 8, fp_limit - 8] {
                for kind in [KIND_SP, KIND_DEREF_FP, KIND_UNSUPPORTED + 3] {
                    let w = rule_word(
                        kind,
                        offset_field(cfa, CFA_OFF_BITS),
                        FP_AT_CFA,
                        offset_field(fp, FP_OFF_BITS),
                    );
                    assert_eq!(super::kind(w), kind);
                    assert_eq!(fp_rule(w), FP_AT_CFA);
                    assert_eq!(cfa_offset(w), i64::from(cfa), "{w:#x}");
                    assert_eq!(fp_offset(w), i64::from(fp), "{w:#x}");
                }
            }
        }
    }

    #[test]
    fn a_plt_row_keeps_its_threshold() {
        for t in 0..16 {
            let w = rule_word(KIND_PLT, t, FP_SAME, 0);
            assert_eq!(
                (kind(w), plt_threshold(w), fp_rule(w)),
                (KIND_PLT, t, FP_SAME)
            );
        }
    }

    #[test]
    fn rows_sort_as_their_addresses_and_keep_both_halves() {
        let rule = rule_word(KIND_FP, offset_field(16, CFA_OFF_BITS), FP_LOST, 0);
        let rows = [
            row(0, u32::MAX),
            row(1, 0),
            row(0x1000, rule),
            row(u32::MAX, 0),
        ];
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
        assert_eq!((row_pc(rows[2]), row_rule(rows[2])), (0x1000, rule));
        assert_eq!(row_pc(rows[3]), u32::MAX);
    }

    #[test]
    fn offsets_that_fit_are_multiples_of_8_within_the_field() {
        assert!(offset_fits(0, FP_OFF_BITS));
        assert!(offset_fits(-256, FP_OFF_BITS));
        assert!(offset_fits(248, FP_OFF_BITS));
        assert!(!offset_fits(256, FP_OFF_BITS));
        assert!(!offset_fits(-264, FP_OFF_BITS));
        assert!(!offset_fits(12, CFA_OFF_BITS));
        assert!(!offset_fits(8 << 19, CFA_OFF_BITS), "4 MiB does not fit");
        assert!(offset_fits((8 << 19) - 8, CFA_OFF_BITS));
    }
}
