//! jitdump files (`jit-PID.dump`, Linux tools/perf/Documentation/
//! jitdump-specification.txt), written by V8 `--perf-prof`, the JVM's
//! jvmti agent and others; a process that writes one maps it, which is
//! how it is found (`/proc/PID/maps`). Only JIT_CODE_LOAD (name, address,
//! size) and JIT_CODE_MOVE matter here; every other record is skipped.
//! The file only grows: records already read are not read again, and the
//! native code each load record carries is skipped, not read.

use std::{fs::File, io, os::unix::fs::FileExt as _};

use super::perf_map::{name_of, MAX_NAME};

/// "JiTD" in the writer's byte order: a file from another byte order (or
/// not a jitdump) is ignored.
const MAGIC: u32 = 0x4A69_5444;
/// File header: magic, version, total_size, elf_mach, pad1, pid (u32 each),
/// timestamp, flags (u64).
const FILE_HEADER: u64 = 40;
/// Record header: id, total_size (u32), timestamp (u64).
const RECORD_HEADER: u64 = 16;
/// JIT_CODE_LOAD after the record header: pid, tid (u32), vma, code_addr,
/// code_size, code_index (u64); then the name (NUL-terminated), then code.
const LOAD_FIXED: u64 = 40;
/// JIT_CODE_MOVE after the record header: pid, tid, vma, old_code_addr,
/// new_code_addr, code_size, code_index.
const MOVE_FIXED: u64 = 48;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;
/// A record larger than this is taken for corruption: the file is dropped.
const MAX_RECORD: u64 = 1 << 30;

#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    Load { start: u64, size: u64, name: String },
    Move { from: u64, to: u64, size: u64 },
}

#[derive(Default)]
pub struct DumpReader {
    /// Where the next record starts (0: the file header is not read yet).
    offset: u64,
    /// Not a jitdump, or corrupt: nothing more is read.
    pub dead: bool,
}

impl DumpReader {
    /// Reads the records appended since the last call (complete ones only),
    /// taking the bytes read off `budget`.
    pub fn read_new(
        &mut self,
        file: &File,
        budget: &mut u64,
        mut record: impl FnMut(Record),
    ) -> io::Result<()> {
        let len = file.metadata()?.len();
        if self.offset == 0 && !self.dead {
            self.header(file, len, budget)?;
        }
        while !self.dead && self.offset + RECORD_HEADER <= len && *budget >= RECORD_HEADER {
            let mut h = [0u8; RECORD_HEADER as usize];
            read_exact_at(file, &mut h, self.offset, budget)?;
            let id = u32_at(&h, 0);
            let size = u64::from(u32_at(&h, 4));
            if !(RECORD_HEADER..=MAX_RECORD).contains(&size) {
                self.dead = true;
                break;
            }
            if self.offset + size > len {
                break; // still being written
            }
            let body = self.offset + RECORD_HEADER;
            match id {
                JIT_CODE_LOAD if size >= RECORD_HEADER + LOAD_FIXED => {
                    let mut f = [0u8; LOAD_FIXED as usize];
                    read_exact_at(file, &mut f, body, budget)?;
                    let (start, code_size) = (u64_at(&f, 16), u64_at(&f, 24));
                    let room = (size - RECORD_HEADER - LOAD_FIXED).saturating_sub(code_size);
                    let mut name = vec![0u8; room.min(MAX_NAME as u64 + 1) as usize];
                    read_exact_at(file, &mut name, body + LOAD_FIXED, budget)?;
                    let name = name.split(|&b| b == 0).next().unwrap_or_default();
                    record(Record::Load {
                        start,
                        size: code_size,
                        name: name_of(name),
                    });
                }
                JIT_CODE_MOVE if size >= RECORD_HEADER + MOVE_FIXED => {
                    let mut f = [0u8; MOVE_FIXED as usize];
                    read_exact_at(file, &mut f, body, budget)?;
                    record(Record::Move {
                        from: u64_at(&f, 16),
                        to: u64_at(&f, 24),
                        size: u64_at(&f, 32),
                    });
                }
                _ => {}
            }
            self.offset += size;
        }
        Ok(())
    }

    fn header(&mut self, file: &File, len: u64, budget: &mut u64) -> io::Result<()> {
        if len < FILE_HEADER || *budget < FILE_HEADER {
            return Ok(()); // not written yet
        }
        let mut h = [0u8; FILE_HEADER as usize];
        read_exact_at(file, &mut h, 0, budget)?;
        let total = u64::from(u32_at(&h, 8));
        if u32_at(&h, 0) != MAGIC || !(FILE_HEADER..=4096).contains(&total) {
            self.dead = true;
            return Ok(());
        }
        self.offset = total;
        Ok(())
    }
}

fn read_exact_at(file: &File, buf: &mut [u8], at: u64, budget: &mut u64) -> io::Result<()> {
    file.read_exact_at(buf, at)?;
    *budget = budget.saturating_sub(buf.len() as u64);
    Ok(())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}
