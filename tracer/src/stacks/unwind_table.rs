//! Compact unwind tables for unwinding in the kernel, built from
//! one ELF file's `.eh_frame` (and `.debug_frame` where `.eh_frame` does not
//! cover a function), reading only its headers and those sections
//! (`elf.rs`). `kernel_tables.rs` loads the rows into the BPF maps; the
//! design and the walker that reads them are in `docs/unwind-tables.md`.
//!
//! A table is a list of rows sorted by address, 8 bytes each: the row that
//! applies to a program counter is the last one whose address is at or below
//! it. Each row says how to find the CFA (the caller's stack pointer before
//! the call) from RSP or RBP, and where the caller's RBP was saved; the
//! return address is always at CFA - 8 on x86-64 (a row where it is not is
//! marked unsupported). Only RSP, RBP and RIP are tracked: a CFA computed
//! from another register cannot be followed and is marked, not guessed.
//!
//! ```ignore
//! let (loads, table) = UnwindTable::from_file(&File::open("/usr/lib/x86_64-linux-gnu/libc.so.6")?);
//! let table = table?;
//! let rule = table.lookup(return_address - bias - 1);
//! let words: Vec<u64> = table.encoded(); // what user space writes to the BPF row map
//! ```

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, Operation,
    Register, RegisterRule, UnwindContext, UnwindSection, UnwindTableRow,
};
mod elf;
mod encode;

pub(crate) use elf::Loads;

#[cfg(test)]
pub(crate) use encode::decode_rule;
use encode::encode_rule;

type Slice<'a> = EndianSlice<'a, LittleEndian>;

pub(crate) use tracer_common::unwind_row::ROW_BYTES;
use tracer_common::unwind_row::{offset_fits, CFA_OFF_BITS, FP_OFF_BITS};

/// A CFI section larger than this (after decompression) is refused, not
/// read: the file belongs to the traced process. The largest seen here is
/// a few MiB (a 129 MiB debug build of this tracer).
const MAX_CFI_SECTION: u64 = 64 << 20;

/// Rows per table at most (32 MiB encoded); the BPF binary search is
/// bounded by log2 of it (22 steps).
pub(crate) const MAX_ROWS: usize = 1 << 22;

const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// How to find the CFA at an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cfa {
    /// CFA = RSP + offset.
    Sp(i32),
    /// CFA = RBP + offset.
    Fp(i32),
    /// CFA = *(RSP + offset).
    DerefSp(i32),
    /// CFA = *(RBP + offset): gcc's stack realignment (`main` with
    /// over-aligned locals) saves the old CFA in the frame.
    DerefFp(i32),
    /// A PLT entry: CFA = RSP + 8, plus 8 once past the entry's push
    /// (`(RIP & 15) >= threshold`), the expression ld writes for `.plt`.
    Plt { threshold: u8 },
    /// A signal trampoline (`__restore_rt`, CIE augmentation `S`): RIP, RSP
    /// and RBP of the interrupted code are in the `ucontext_t` at RSP.
    Signal,
    /// The outermost frame (return address undefined, as in `_start`):
    /// the stack is complete.
    Outermost,
    /// No FDE covers this address (a gap between functions): the walker
    /// takes a frame-pointer step, as for JIT code.
    NoInfo,
    /// A rule the walker cannot follow: the walk ends, counted by reason.
    Unsupported(Unsupported),
}

/// Why a row cannot be followed. Each reason is counted by the builder
/// (per file) and by the walker (per stack it ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unsupported {
    /// CFA computed from a register other than RSP or RBP.
    CfaRegister = 0,
    /// A CFA expression that is none of the recognised shapes.
    CfaExpression = 1,
    /// The return address is not at CFA - 8.
    ReturnAddress = 2,
    /// An offset that is not a multiple of 8 or does not fit the row.
    Offset = 3,
}

/// Where the caller's RBP is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fp {
    /// Unchanged: this function has not saved (or has restored) RBP.
    Same,
    /// Saved at CFA + offset.
    AtCfa(i32),
    /// Somewhere the walker cannot read (another register, an
    /// expression): RBP is unknown in the caller.
    Lost,
}

/// One row's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) cfa: Cfa,
    pub(crate) fp: Fp,
}

/// One row: from `pc` (a file address, before load bias) on, `rule`
/// applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) pc: u64,
    pub(crate) rule: Rule,
}

/// What building one table met, for the design numbers and the loss
/// counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BuildStats {
    pub(crate) fdes: usize,
    /// FDEs taken from `.debug_frame` (functions `.eh_frame` lacks).
    pub(crate) debug_frame_fdes: usize,
    /// Rows before merging equal neighbours.
    pub(crate) raw_rows: usize,
    /// Rows marked unsupported, by `Unsupported` as index.
    pub(crate) unsupported: [usize; 4],
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum TableError {
    #[error("not an ELF file this tracer can read: {0}")]
    Elf(#[from] object::Error),
    #[error("malformed call frame information: {0}")]
    Cfi(#[from] gimli::Error),
    #[error("no .eh_frame or .debug_frame: the file has no unwind information")]
    NoCfi,
    #[error("code spans more than 4 GiB; a row's address is 32 bits")]
    TooLarge,
    #[error("a call frame section of {0} bytes, more than this tracer reads (64 MiB)")]
    SectionTooLarge(u64),
    #[error("more than {MAX_ROWS} unwind rows")]
    TooManyRows,
    #[error("more section headers than this tracer reads (65536)")]
    TooManySections,
    #[error("a compressed call frame section: this tracer does not decompress them")]
    Compressed,
}

/// One file's rows, sorted by address.
#[derive(Debug)]
pub(crate) struct UnwindTable {
    /// The lowest row address; encoded addresses are relative to it.
    pub(crate) base: u64,
    pub(crate) rows: Vec<Row>,
    pub(crate) stats: BuildStats,
}

impl UnwindTable {
    /// Builds the table of an ELF file given its bytes (the tests; the
    /// tracer reads files with `from_file`).
    #[cfg(test)]
    pub(crate) fn from_elf(data: &[u8]) -> Result<UnwindTable, TableError> {
        UnwindTable::from_cfi(&elf::read_cfi(data)?)
    }

    /// Builds the table of the ELF file open as `file` without reading it
    /// whole (`elf.rs`), with its PT_LOAD segments (empty when the headers
    /// cannot be read).
    pub(crate) fn from_file(file: &std::fs::File) -> (Loads, Result<UnwindTable, TableError>) {
        let data = object::ReadCache::new(file);
        let loads = elf::read_loads(&data).unwrap_or_default();
        let table = elf::read_cfi(&data).and_then(|cfi| UnwindTable::from_cfi(&cfi));
        (loads, table)
    }

    fn from_cfi(cfi: &elf::CfiInput<'_>) -> Result<UnwindTable, TableError> {
        if cfi.eh_frame.is_none() && cfi.debug_frame.is_none() {
            return Err(TableError::NoCfi);
        }
        let mut stats = BuildStats::default();
        let mut rows = Vec::new();
        let mut eh_ranges = Vec::new();
        if let Some((eh_addr, bytes)) = cfi.eh_frame {
            let mut bases = BaseAddresses::default().set_eh_frame(eh_addr);
            if let Some(a) = cfi.eh_frame_hdr {
                bases = bases.set_eh_frame_hdr(a);
            }
            if let Some(a) = cfi.text {
                bases = bases.set_text(a);
            }
            if let Some(a) = cfi.got {
                bases = bases.set_got(a);
            }
            let mut eh_frame = EhFrame::new(bytes, LittleEndian);
            eh_frame.set_address_size(8);
            let take_all = |_: &_| true;
            collect(
                &eh_frame,
                &bases,
                take_all,
                &mut rows,
                &mut eh_ranges,
                &mut stats,
            )?;
        }
        eh_ranges.sort_unstable_by_key(|r: &(u64, u64)| r.0);
        if let Some(bytes) = cfi.debug_frame {
            let mut debug_frame = DebugFrame::new(bytes, LittleEndian);
            debug_frame.set_address_size(8);
            let before = stats.fdes;
            let uncovered = |r: &(u64, u64)| !overlaps(&eh_ranges, *r);
            let mut unused = Vec::new();
            let bases = BaseAddresses::default();
            collect(
                &debug_frame,
                &bases,
                uncovered,
                &mut rows,
                &mut unused,
                &mut stats,
            )?;
            stats.debug_frame_fdes = stats.fdes - before;
        }
        stats.raw_rows = rows.len();
        let table = UnwindTable::from_rows(rows, stats);
        if table.rows.len() > MAX_ROWS {
            return Err(TableError::TooManyRows);
        }
        Ok(table)
    }

    /// Sorts, resolves rows at the same address (a function's first row
    /// beats the end marker of the one before) and merges neighbours with
    /// the same rule.
    fn from_rows(mut rows: Vec<Row>, stats: BuildStats) -> UnwindTable {
        rows.sort_by_key(|r| (r.pc, r.rule.cfa == Cfa::NoInfo));
        rows.dedup_by_key(|r| r.pc);
        rows.dedup_by_key(|r| r.rule);
        let base = rows.first().map_or(0, |r| r.pc);
        UnwindTable { base, rows, stats }
    }

    /// The rule at a file address: the last row at or below it (what the
    /// BPF walker does; the tests check tables with it).
    #[cfg(test)]
    pub(crate) fn lookup(&self, pc: u64) -> Option<Rule> {
        let after = self.rows.partition_point(|r| r.pc <= pc);
        Some(self.rows.get(after.checked_sub(1)?)?.rule)
    }

    /// The rows as the BPF program reads them: `(pc - base) << 32 | rule`,
    /// so that the words sort as the addresses do.
    pub(crate) fn encoded(&self) -> Result<Vec<u64>, TableError> {
        self.rows
            .iter()
            .map(|r| {
                let rel = u32::try_from(r.pc - self.base).map_err(|_| TableError::TooLarge)?;
                Ok(tracer_common::unwind_row::row(rel, encode_rule(r.rule)))
            })
            .collect()
    }
}

/// Whether [start, end) overlaps one of the sorted ranges.
fn overlaps(sorted: &[(u64, u64)], (start, end): (u64, u64)) -> bool {
    let i = sorted.partition_point(|r| r.0 < end);
    i > 0 && sorted[..i].iter().rev().take(64).any(|r| r.1 > start)
}

/// Appends the rows of every FDE of `section` that `keep` accepts (by its
/// address range), and an end marker after each.
fn collect<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    keep: impl Fn(&(u64, u64)) -> bool,
    rows: &mut Vec<Row>,
    ranges: &mut Vec<(u64, u64)>,
    stats: &mut BuildStats,
) -> Result<(), TableError> {
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o))?;
        let range = (fde.initial_address(), fde.end_address());
        if range.0 >= range.1 || !keep(&range) {
            continue;
        }
        stats.fdes += 1;
        ranges.push(range);
        let signal = fde.is_signal_trampoline();
        let mut table = fde.rows(section, bases, &mut ctx)?;
        while let Some(row) = table.next_row()? {
            if rows.len() >= 2 * MAX_ROWS {
                return Err(TableError::TooManyRows);
            }
            let rule = rule_of(row, section, signal)?;
            if let Cfa::Unsupported(why) = rule.cfa {
                stats.unsupported[why as usize] += 1;
            }
            rows.push(Row {
                pc: row.start_address(),
                rule,
            });
        }
        rows.push(Row {
            pc: range.1,
            rule: Rule {
                cfa: Cfa::NoInfo,
                fp: Fp::Same,
            },
        });
    }
    Ok(())
}

/// The rule of one row of gimli's evaluated CFI table.
fn rule_of<'a, S: UnwindSection<Slice<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
    signal: bool,
) -> Result<Rule, gimli::Error> {
    let rule = |cfa| Rule { cfa, fp: Fp::Same };
    if signal {
        return Ok(rule(Cfa::Signal));
    }
    match row.register(RA) {
        Some(RegisterRule::Offset(-8)) => {}
        // No rule at all (the CIE never names RA) is read as undefined too.
        None | Some(RegisterRule::Undefined) => return Ok(rule(Cfa::Outermost)),
        _ => return Ok(rule(Cfa::Unsupported(Unsupported::ReturnAddress))),
    }
    let offset = |o, make: fn(i32) -> Cfa| {
        words(o, CFA_OFF_BITS).map_or(Cfa::Unsupported(Unsupported::Offset), make)
    };
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset {
            register,
            offset: o,
        } => match *register {
            RSP => offset(*o, Cfa::Sp),
            RBP => offset(*o, Cfa::Fp),
            _ => Cfa::Unsupported(Unsupported::CfaRegister),
        },
        CfaRule::Expression(expr) => cfa_expression(&expr.get(section)?.0)?,
    };
    let fp = match row.register(RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Fp::Same,
        Some(RegisterRule::Offset(o)) => words(o, FP_OFF_BITS).map_or(Fp::Lost, Fp::AtCfa),
        _ => Fp::Lost,
    };
    Ok(Rule { cfa, fp })
}

/// `offset` if it is a multiple of 8 that fits `bits` signed bits once
/// divided by 8 (CFA offsets in 20 bits: ±4 MiB of frame; saved-RBP
/// offsets in 6 bits: CFA-256 .. CFA+248).
fn words(offset: i64, bits: u32) -> Option<i32> {
    offset_fits(offset, bits)
        .then(|| i32::try_from(offset).ok())
        .flatten()
}

/// Recognises the CFA expressions that occur in practice on x86-64:
/// `breg7/breg6 N; deref` (signal frames, stack realignment) and the PLT
/// expression `breg7 8; breg16 0; lit15; and; litK; ge; lit3; shl; plus`.
fn cfa_expression(bytes: &Slice<'_>) -> Result<Cfa, gimli::Error> {
    let encoding = gimli::Encoding {
        address_size: 8,
        format: gimli::Format::Dwarf32,
        version: 4,
    };
    let mut ops = Vec::new();
    let mut iter = gimli::Expression(*bytes).operations(encoding);
    while let Some(op) = iter.next()? {
        if ops.len() == 9 {
            return Ok(Cfa::Unsupported(Unsupported::CfaExpression));
        }
        ops.push(op);
    }
    let constant = |op: &Operation<Slice<'_>>| match op {
        Operation::UnsignedConstant { value } => Some(*value),
        _ => None,
    };
    let reg = |op: &Operation<Slice<'_>>| match op {
        Operation::RegisterOffset {
            register, offset, ..
        } => Some((*register, *offset)),
        _ => None,
    };
    let offset = |o, make: fn(i32) -> Cfa| {
        words(o, CFA_OFF_BITS).map_or(Cfa::Unsupported(Unsupported::Offset), make)
    };
    let cfa = match ops.as_slice() {
        [r, Operation::Deref { .. }] => match reg(r) {
            Some((RSP, o)) => offset(o, Cfa::DerefSp),
            Some((RBP, o)) => offset(o, Cfa::DerefFp),
            _ => Cfa::Unsupported(Unsupported::CfaExpression),
        },
        [sp, ip, mask, Operation::And, k, Operation::Ge, three, Operation::Shl, Operation::Plus]
            if reg(sp) == Some((RSP, 8))
                && reg(ip) == Some((RA, 0))
                && constant(mask) == Some(15)
                && constant(three) == Some(3) =>
        {
            match constant(k).and_then(|k| u8::try_from(k).ok()) {
                Some(threshold) if threshold < 16 => Cfa::Plt { threshold },
                _ => Cfa::Unsupported(Unsupported::CfaExpression),
            }
        }
        _ => Cfa::Unsupported(Unsupported::CfaExpression),
    };
    Ok(cfa)
}

#[cfg(test)]
mod tests;
