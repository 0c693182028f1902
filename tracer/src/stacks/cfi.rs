//! The unwind sections of one ELF file (.eh_frame, .eh_frame_hdr,
//! .debug_frame, .text, .got and the load segments), parsed once per file
//! and shared by every process that maps it: keyed by device and inode,
//! not by path, and dropped a while after the last process that maps it is
//! gone. The per-process unwinders built from them are in `unwind.rs`.

use std::{
    collections::HashMap,
    ops::Range,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::ExplicitModuleSectionInfo;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use crate::tracee::process::Mapping;

pub(super) type Data = Arc<[u8]>;

/// The unwind-relevant parts of one ELF file.
pub(super) struct Sections {
    /// PT_LOAD segments: (file offset range, vaddr) to compute load bias.
    loads: Vec<(Range<u64>, u64)>,
    text: Option<(Range<u64>, Data)>,
    eh_frame: Option<(Range<u64>, Data)>,
    eh_frame_hdr: Option<(Range<u64>, Data)>,
    debug_frame: Option<Data>,
    got: Option<Range<u64>>,
}

impl Sections {
    pub(super) fn parse(data: &[u8]) -> Option<Sections> {
        let file = object::File::parse(data).ok()?;
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let bytes = s.uncompressed_data().ok()?;
            Some((s.address()..s.address() + s.size(), Data::from(&*bytes)))
        };
        Some(Sections {
            loads: load_segments(&file),
            text: section(".text"),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|(_, d)| d),
            got: file
                .section_by_name(".got")
                .map(|s| s.address()..s.address() + s.size()),
        })
    }

    /// Load bias of a mapping of this file: actual address - stated address.
    /// Mappings are page-aligned, segments need not be (lld, which links
    /// Rust, puts the text segment at file offset 0x14500, vaddr 0x15500,
    /// mapped from offset 0x14000): match on the page-aligned offsets.
    pub(super) fn bias(&self, m: &Mapping) -> Option<u64> {
        load_bias(&self.loads, m)
    }

    pub(super) fn module_info(&self) -> ExplicitModuleSectionInfo<Data> {
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.as_ref().map(|(r, _)| r.clone()),
            text: self.text.as_ref().map(|(_, d)| d.clone()),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, d)| d.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            debug_frame: self.debug_frame.clone(),
            ..Default::default()
        }
    }
}

/// An ELF file's PT_LOAD segments: (file offset range, vaddr).
pub(super) fn load_segments(file: &object::File<'_>) -> Vec<(Range<u64>, u64)> {
    file.segments()
        .map(|seg| {
            let (off, size) = seg.file_range();
            (off..off + size, seg.address())
        })
        .collect()
}

/// Load bias of a mapping of a file with these load segments: actual
/// address - stated address (see `Sections::bias`).
pub(super) fn load_bias(loads: &[(Range<u64>, u64)], m: &Mapping) -> Option<u64> {
    let (range, vaddr) = loads
        .iter()
        .find(|(r, _)| r.start & !0xfff == m.offset)
        .or_else(|| loads.iter().find(|(r, _)| r.contains(&m.offset)))?;
    let svma = (vaddr & !0xfff) + (m.offset - (range.start & !0xfff));
    Some(m.start.wrapping_sub(svma))
}

/// A parsed file no unwinder uses any more is kept this long, so that a
/// program run again and again (a shell loop) is not parsed each time.
const UNUSED_FILE_TTL: Duration = Duration::from_secs(10);

/// Which file: (device, inode), the same through every path and mount
/// namespace it is seen from.
pub type FileKey = (u64, u64);

struct CachedFile {
    /// None when the file is not ELF or could not be parsed.
    sections: Option<Arc<Sections>>,
    /// When an unwinder last took it.
    used: Instant,
}

/// Parsed files by identity, shared by the unwinders of every process.
#[derive(Default)]
pub(super) struct SectionCache {
    files: HashMap<FileKey, CachedFile>,
}

impl SectionCache {
    /// The sections of file `key`, read from `host` (a path the tracer
    /// can open) on its first use.
    pub(super) fn get(&mut self, key: FileKey, host: &Path) -> Option<Arc<Sections>> {
        let file = self.files.entry(key).or_insert_with(|| CachedFile {
            sections: read_sections(host),
            used: Instant::now(),
        });
        file.used = Instant::now();
        file.sections.clone()
    }

    /// Drops parsed files that no process's unwinder holds and none took
    /// for UNUSED_FILE_TTL.
    pub(super) fn evict_unused(&mut self) {
        self.files.retain(|_, f| {
            let in_use = f
                .sections
                .as_ref()
                .is_some_and(|s| Arc::strong_count(s) > 1);
            in_use || f.used.elapsed() < UNUSED_FILE_TTL
        });
    }

    /// How many parsed files are held.
    pub(super) fn held(&self) -> usize {
        self.files.len()
    }
}

/// The whole file is read: bounded, and a regular file only (the mapped
/// file a process chose; see `read_bounded`).
fn read_sections(path: &Path) -> Option<Arc<Sections>> {
    use crate::tracee::elf::{read_bounded, MAX_OBJECT_BYTES};
    let data = read_bounded(path, MAX_OBJECT_BYTES).ok()?;
    Sections::parse(&data).map(Arc::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_bias_matches_page_aligned_segments_as_lld_lays_them_out() {
        // rust-lld: text at file offset 0x14500, vaddr 0x15500, mapped from
        // file offset 0x14000 (which the first segment also contains).
        let sections = Sections {
            loads: vec![(0..0x14500, 0), (0x14500..0x54980, 0x15500)],
            text: None,
            eh_frame: None,
            eh_frame_hdr: None,
            debug_frame: None,
            got: None,
        };
        let exec = Mapping {
            start: 0x7000_0001_5000,
            end: 0x7000_0005_5000,
            offset: 0x14000,
            executable: true,
            path: "rust_allocs".into(),
            dev_inode: (0, 0),
        };
        assert_eq!(sections.bias(&exec), Some(0x7000_0000_0000));
        let first = Mapping {
            start: 0x7000_0000_0000,
            offset: 0,
            executable: false,
            ..exec
        };
        assert_eq!(sections.bias(&first), Some(0x7000_0000_0000));
    }
}
