//! The parts of an ELF file a table is built from, read without reading
//! the whole file: the file header, the program headers (PT_LOAD, for the
//! load bias), the section headers and their names, and the bytes of
//! `.eh_frame` and `.debug_frame` only. On an open file (`ReadCache` over
//! `std::fs::File`) that is a few reads of the header area and one read per
//! CFI section, each bounded (MAX_CFI_SECTION, MAX_SECTIONS): a 100 MiB
//! library costs the tracer its few MiB of CFI, not its size. Plain reads,
//! not a memory map: a file truncated meanwhile gives a short read (an
//! error, counted), where a mapped page past the new end would be SIGBUS.

use std::ops::Range;

use object::{
    elf::{FileHeader64, PT_LOAD, SHF_COMPRESSED, SHT_NOBITS},
    read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _},
    LittleEndian, ReadRef,
};

use super::{TableError, MAX_CFI_SECTION};

/// Section headers read at most (64 bytes each): 4 MiB. ELF files seen
/// here have under a hundred; a larger count is a hostile or broken file.
const MAX_SECTIONS: usize = 1 << 16;

/// What a table is built from, borrowed from the reader.
pub(crate) struct CfiInput<'d> {
    /// `.eh_frame`'s address and bytes.
    pub(crate) eh_frame: Option<(u64, &'d [u8])>,
    pub(crate) debug_frame: Option<&'d [u8]>,
    /// Addresses `.eh_frame` pointers may be relative to.
    pub(crate) eh_frame_hdr: Option<u64>,
    pub(crate) text: Option<u64>,
    pub(crate) got: Option<u64>,
}

/// An ELF file's PT_LOAD segments: (file offset range, vaddr), as
/// `cfi::load_segments` gives them from a parsed `object::File`.
pub(crate) type Loads = Vec<(Range<u64>, u64)>;

type Header = FileHeader64<LittleEndian>;

/// The PT_LOAD segments of a 64-bit little-endian ELF file.
pub(crate) fn read_loads<'d, R: ReadRef<'d>>(data: R) -> Result<Loads, TableError> {
    let header = Header::parse(data)?;
    let endian = header.endian()?;
    Ok(header
        .program_headers(endian, data)?
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD)
        .map(|p| {
            let (off, size) = (p.p_offset(endian), p.p_filesz(endian));
            (off..off.wrapping_add(size), p.p_vaddr(endian))
        })
        .collect())
}

/// The CFI sections of a 64-bit little-endian ELF file (the only kind the
/// x86-64 walker follows).
pub(crate) fn read_cfi<'d, R: ReadRef<'d>>(data: R) -> Result<CfiInput<'d>, TableError> {
    let header = Header::parse(data)?;
    let endian = header.endian()?;
    if header.shnum(endian, data)? > MAX_SECTIONS {
        return Err(TableError::TooManySections);
    }
    let sections = header.sections(endian, data)?;
    let find = |name: &str| {
        sections
            .section_by_name(endian, name.as_bytes())
            .map(|(_, s)| s)
    };
    let addr = |name: &str| find(name).map(|s| s.sh_addr(endian));
    let bytes = |name: &str| -> Result<Option<(u64, &'d [u8])>, TableError> {
        let Some(s) = find(name) else {
            return Ok(None);
        };
        let size = s.sh_size(endian);
        if s.sh_type(endian) != SHT_NOBITS && size > MAX_CFI_SECTION {
            return Err(TableError::SectionTooLarge(size));
        }
        if s.sh_flags(endian) & u64::from(SHF_COMPRESSED) != 0 {
            // This build of `object` has no decompression.
            return Err(TableError::Compressed);
        }
        Ok(Some((s.sh_addr(endian), s.data(endian, data)?)))
    };
    let eh_frame = bytes(".eh_frame")?;
    let debug_frame = bytes(".debug_frame")?.map(|(_, b)| b);
    Ok(CfiInput {
        eh_frame,
        debug_frame,
        eh_frame_hdr: addr(".eh_frame_hdr"),
        text: addr(".text"),
        got: addr(".got"),
    })
}
