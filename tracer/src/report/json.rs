//! JSON: the whole `Profile`, for scripts and for comparing runs.
//!
//! Each distinct frame is written once, in a top-level `"frames"` table, and
//! each stack lists indices into it (`"frames": [0, 1, 5]`, leaf first): a
//! report of 100 k stacks of 40 frames repeats a few thousand frames, and
//! writing each in full made a 1.4 GB file.
//!
//! Strings are exact (a parser gets back the very command line or symbol
//! name), yet the file is safe to print on a terminal: serde_json writes C0
//! controls as `\uNNNN`, and `TerminalSafe` does the same for C1 controls
//! and the bidirectional and separator characters it would pass raw.

use std::{
    cell::RefCell,
    collections::{hash_map::Entry, HashMap},
    hash::{BuildHasherDefault, Hash, Hasher},
    io::Write,
    sync::Arc,
};

use anyhow::Context;
use serde::{
    ser::{SerializeSeq, SerializeStruct},
    Serialize, Serializer,
};

use super::{
    json_layout::{Layout, TerminalSafe},
    Counts, ExitStack, Frame, NotFreedAtExit, Profile, StackReport,
};

/// Bumped when a field changes meaning or disappears; adding fields keeps it.
/// 2: stacks' `frames` are indices into the top-level `frames` table.
const FORMAT: &str = "memtrace-bpf/2";

/// Writes the profile as JSON with a `"format"` version field, streamed to
/// `w`: small sections pretty-printed, one line per stack, process, hook
/// and table frame.
pub fn write_json(p: &Profile, w: &mut impl Write) -> anyhow::Result<()> {
    let table = RefCell::new(FrameTable::default());
    let doc = Document { p, table: &table };
    let mut ser = serde_json::Serializer::with_formatter(&mut *w, TerminalSafe(Layout::new()));
    doc.serialize(&mut ser).context("writing the JSON report")?;
    writeln!(w).context("writing the JSON report")?;
    Ok(())
}

/// Each distinct frame once, numbered by first appearance: stacks hold
/// indices into it. Frames are shared `Arc`s, so most are found by pointer;
/// equal frames in distinct `Arc`s (e.g. `[stack lost]`) by value.
#[derive(Default)]
pub struct FrameTable<'a> {
    by_ptr: PtrMap<u32>,
    by_value: HashMap<ByValue<'a>, u32>,
    frames: Vec<&'a Frame>,
}

impl<'a> FrameTable<'a> {
    /// The table indices of `frames`, in the same order; frames not yet in
    /// the table are appended. (The document writes lists with `Indexed`,
    /// which builds no list.)
    #[cfg(test)]
    pub fn index(&mut self, frames: &'a [Arc<Frame>]) -> Vec<u32> {
        frames.iter().map(|f| self.intern(f)).collect()
    }

    /// The table index of `frame`, appended if it is new.
    pub fn intern(&mut self, frame: &'a Arc<Frame>) -> u32 {
        // The pointer stays valid and unique: `'a` borrows every Arc.
        let ptr = Arc::as_ptr(frame);
        if let Some(&i) = self.by_ptr.get(&ptr) {
            return i;
        }
        let i = match self.by_value.entry(ByValue(frame)) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                // 2^32 distinct frames would take over 300 GiB of names.
                let i = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
                self.frames.push(frame);
                *e.insert(i)
            }
        };
        self.by_ptr.insert(ptr, i);
        i
    }

    /// The distinct frames, in index order.
    #[cfg(test)]
    pub fn frames(&self) -> &[&'a Frame] {
        &self.frames
    }
}

/// A list of frames written as indices into the document's frame table:
/// what every list of frames in the document is written as (the stacks
/// today; any later section of stacks the same way).
pub struct Indexed<'a> {
    pub frames: &'a [Arc<Frame>],
    pub table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for Indexed<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Interned while written: no list of indices is built per stack
        // (every allocation of the report costs a trap through the
        // allocator probes, which stay attached until it is written).
        let mut seq = s.serialize_seq(Some(self.frames.len()))?;
        for frame in self.frames {
            let i = self.table.borrow_mut().intern(frame);
            seq.serialize_element(&i)?;
        }
        seq.end()
    }
}

impl Serialize for FrameTable<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(&self.frames)
    }
}

/// A map keyed by frame pointers (of frames borrowed for the map's life).
pub type PtrMap<V> = HashMap<*const Frame, V, BuildHasherDefault<PtrHasher>>;

/// Hashes a pointer with one multiply: SipHash, the default, is most of
/// the cost of looking up the millions of frames of a large report, and
/// pointers are not chosen by an attacker.
#[derive(Default)]
pub struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // The high half of the 128-bit product mixes every bit of the
        // (aligned, so low-zero) address into the bits the table uses.
        let m = u128::from(n as u64) * 0x9e37_79b9_7f4a_7c15;
        self.0 = (m >> 64) as u64 ^ m as u64;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A frame compared and hashed by value (`Frame` is not `Hash`).
struct ByValue<'a>(&'a Frame);

impl PartialEq for ByValue<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for ByValue<'_> {}

impl Hash for ByValue<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let Frame {
            function,
            module,
            offset,
            file,
            line,
            inlined,
            build_id,
        } = self.0;
        (function, module, offset, file, line, inlined, build_id).hash(h);
    }
}

/// The document: the profile's fields, then the frame table its stacks
/// index. The table comes last so that every section can add to it while
/// it is written (one pass, nothing held but the table).
struct Document<'a> {
    p: &'a Profile,
    table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Destructured in full: a field added to `Profile` does not compile
        // here until it is written (with its frames through `self.table`).
        let Profile {
            target,
            duration_secs,
            start_unix_ns,
            end_reason,
            sample_rate,
            unwind,
            processes,
            hooks,
            totals,
            stacks,
            not_freed_at_exit,
            losses,
            notes,
            snapshots,
            min_age_secs,
            oom_kills,
            temporary,
            group_by,
            cgroup_memory,
        } = self.p;
        let mut m = s.serialize_struct("Profile", 22)?;
        m.serialize_field("format", FORMAT)?;
        m.serialize_field("target", target)?;
        m.serialize_field("duration_secs", duration_secs)?;
        m.serialize_field("start_unix_ns", start_unix_ns)?;
        m.serialize_field("end_reason", end_reason)?;
        m.serialize_field("sample_rate", sample_rate)?;
        m.serialize_field("unwind", unwind)?;
        m.serialize_field("min_age_secs", min_age_secs)?;
        m.serialize_field("snapshots", snapshots)?;
        m.serialize_field("processes", processes)?;
        m.serialize_field("cgroup_memory", cgroup_memory)?;
        m.serialize_field("group_by", group_by)?;
        m.serialize_field("groups", &self.p.groups())?;
        m.serialize_field("hooks", hooks)?;
        m.serialize_field("totals", totals)?;
        m.serialize_field("temporary", temporary)?;
        m.serialize_field("oom_kills", oom_kills)?;
        m.serialize_field(
            "stacks",
            &Stacks {
                stacks,
                table: self.table,
            },
        )?;
        m.serialize_field(
            "not_freed_at_exit",
            &AtExit {
                section: not_freed_at_exit,
                table: self.table,
            },
        )?;
        m.serialize_field("losses", losses)?;
        m.serialize_field("notes", notes)?;
        m.serialize_field("frames", &*self.table.borrow())?;
        m.end()
    }
}

/// A list of stacks whose frames are written as table indices.
struct Stacks<'a> {
    stacks: &'a [StackReport],
    table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for Stacks<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.stacks.len()))?;
        for stack in self.stacks {
            seq.serialize_element(&IndexedStack {
                stack,
                table: self.table,
            })?;
        }
        seq.end()
    }
}

struct IndexedStack<'a> {
    stack: &'a StackReport,
    table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for IndexedStack<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // In full, as for `Profile`: the fields of version 1 with the
        // counts inline, `frames` replaced by indices.
        let StackReport {
            pid,
            start_time,
            exited_group,
            counts,
            frames,
            truncated,
            series,
            growth_bytes_per_sec,
            trend,
            temporary,
        } = self.stack;
        let Counts {
            inuse_bytes,
            inuse_objects,
            alloc_bytes,
            alloc_objects,
            peak_inuse_bytes,
            peak_inuse_objects,
        } = counts;
        let mut m = s.serialize_struct("StackReport", 14)?;
        m.serialize_field("pid", pid)?;
        m.serialize_field("start_time", start_time)?;
        m.serialize_field("exited_group", exited_group)?;
        m.serialize_field("inuse_bytes", inuse_bytes)?;
        m.serialize_field("inuse_objects", inuse_objects)?;
        m.serialize_field("alloc_bytes", alloc_bytes)?;
        m.serialize_field("alloc_objects", alloc_objects)?;
        // Null when sampling (docs/oom-and-temporary.md).
        m.serialize_field("temporary_objects", &temporary.map(|t| t.objects))?;
        m.serialize_field("temporary_bytes", &temporary.map(|t| t.bytes))?;
        m.serialize_field("peak_inuse_bytes", peak_inuse_bytes)?;
        m.serialize_field("peak_inuse_objects", peak_inuse_objects)?;
        m.serialize_field(
            "frames",
            &Indexed {
                frames,
                table: self.table,
            },
        )?;
        m.serialize_field("truncated", truncated)?;
        m.serialize_field("series", series)?;
        m.serialize_field("growth_bytes_per_sec", growth_bytes_per_sec)?;
        m.serialize_field("trend", trend)?;
        m.end()
    }
}

/// "Not freed at exit", its stacks' frames as table indices.
struct AtExit<'a> {
    section: &'a NotFreedAtExit,
    table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for AtExit<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let NotFreedAtExit {
            processes,
            bytes,
            objects,
            stacks,
            stacks_left_out,
        } = self.section;
        let mut m = s.serialize_struct("NotFreedAtExit", 5)?;
        m.serialize_field("processes", processes)?;
        m.serialize_field("bytes", bytes)?;
        m.serialize_field("objects", objects)?;
        m.serialize_field(
            "stacks",
            &ExitStacks {
                stacks,
                table: self.table,
            },
        )?;
        m.serialize_field("stacks_left_out", stacks_left_out)?;
        m.end()
    }
}

struct ExitStacks<'a> {
    stacks: &'a [ExitStack],
    table: &'a RefCell<FrameTable<'a>>,
}

impl Serialize for ExitStacks<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.stacks.len()))?;
        for stack in self.stacks {
            let ExitStack {
                program,
                processes,
                bytes,
                objects,
                frames,
                truncated,
            } = stack;
            seq.serialize_element(&IndexedExitStack {
                program,
                processes: *processes,
                bytes: *bytes,
                objects: *objects,
                frames: Indexed {
                    frames,
                    table: self.table,
                },
                truncated: *truncated,
            })?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct IndexedExitStack<'a> {
    program: &'a str,
    processes: u64,
    bytes: u64,
    objects: u64,
    frames: Indexed<'a>,
    truncated: bool,
}
