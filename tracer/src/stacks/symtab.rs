//! Names from an ELF file's symbol tables, for the frames blazesym leaves
//! unnamed. blazesym 0.2 refuses a symbol name that is not UTF-8 (its
//! `SymName::name` fails, and with it the lookup), so a program can hide
//! its functions behind one bad byte; here names are bytes, shown with
//! U+FFFD in place of what is not UTF-8.

use std::path::Path;

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _, SymbolKind};

use crate::tracee::elf::{read_bounded, MAX_OBJECT_BYTES};

/// The function symbols of one file, by address.
pub struct SymbolTable {
    /// (start vaddr, size, name), sorted by start.
    functions: Vec<(u64, u64, String)>,
    /// (file offset, file size, vaddr) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl SymbolTable {
    /// None when the file cannot be read or parsed.
    pub fn read(path: &Path) -> Option<SymbolTable> {
        let data = read_bounded(path, MAX_OBJECT_BYTES).ok()?;
        let file = object::File::parse(&*data).ok()?;
        let mut functions: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.is_definition())
            .filter_map(|s| {
                let name = s.name_bytes().ok()?;
                Some((
                    s.address(),
                    s.size(),
                    String::from_utf8_lossy(name).into_owned(),
                ))
            })
            .collect();
        functions.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(a.2.cmp(&b.2)));
        functions.dedup_by(|a, b| a.0 == b.0);
        let segments = file
            .segments()
            .map(|seg| {
                let (offset, size) = seg.file_range();
                (offset, size, seg.address())
            })
            .collect();
        Some(SymbolTable {
            functions,
            segments,
        })
    }

    /// The function containing file offset `offset`, lossily named.
    pub fn name_at(&self, offset: u64) -> Option<&str> {
        let vaddr = self.segments.iter().find_map(|&(start, size, vaddr)| {
            let rel = offset.checked_sub(start)?;
            (rel < size).then(|| vaddr.checked_add(rel)).flatten()
        })?;
        let i = self.functions.partition_point(|f| f.0 <= vaddr);
        let (start, size, name) = self.functions.get(i.checked_sub(1)?)?;
        (vaddr - start < (*size).max(1)).then_some(name.as_str())
    }
}
