//! Reads a pprof heap profile (ours, Go's, or a jemalloc / Rust endpoint's)
//! into a `Profile`: sample types by name, functions from each location's
//! lines (innermost first), every string, function and location index
//! checked, and the memory it takes spent from a `Budget` before it is
//! allocated (pb_scan.rs for what decoding allocates).

use std::{collections::HashMap, sync::Arc};

use anyhow::{bail, Context as _};
use prost::Message as _;

use super::{
    input, limits,
    limits::{add, Budget},
    pb_scan,
};
use crate::report::{proto, Counts, Frame, Note, Profile, StackReport};

/// Which `Counts` field a sample type fills.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    InuseBytes,
    InuseObjects,
    AllocBytes,
    AllocObjects,
    PeakBytes,
    PeakObjects,
}

/// pprof's names for our four numbers. jemalloc's pprof exports (and the
/// Rust crates built on them) name their live heap `space` and `objects`.
fn slot(name: &str) -> Option<Slot> {
    match name {
        "inuse_space" | "space" => Some(Slot::InuseBytes),
        "inuse_objects" | "objects" => Some(Slot::InuseObjects),
        "alloc_space" => Some(Slot::AllocBytes),
        "alloc_objects" => Some(Slot::AllocObjects),
        "peak_space" => Some(Slot::PeakBytes),
        "peak_objects" => Some(Slot::PeakObjects),
        _ => None,
    }
}

/// Parses `bytes` (decompressed) as a `perftools.profiles.Profile`,
/// within `budget`.
pub fn parse(bytes: Vec<u8>, budget: &mut Budget) -> anyhow::Result<Profile> {
    let pb = decode(bytes, budget)?;
    let strings = Strings(&pb.string_table);
    let mut notes = Vec::new();
    let slots = sample_slots(&pb, &strings, &mut notes)?;
    let functions = functions(&pb, &strings, budget)?;
    let mappings: HashMap<u64, &proto::Mapping> = pb.mapping.iter().map(|m| (m.id, m)).collect();
    let mut locations = HashMap::with_capacity(pb.location.len());
    for loc in &pb.location {
        let frames = location_frames(loc, &functions, &mappings, &strings, budget)
            .with_context(|| format!("location {}", loc.id))?;
        locations.insert(loc.id, frames);
    }
    let mut p = Profile {
        sample_rate: sample_rate(&pb, &strings),
        duration_secs: pb.duration_nanos.max(0) as f64 / 1e9,
        // 0 is pprof's "unknown"; a time before 1970 is no time either.
        start_unix_ns: u64::try_from(pb.time_nanos).ok().filter(|&t| t > 0),
        end_reason: "read from a pprof file".into(),
        ..Default::default()
    };
    let mut clamped = 0u64;
    for (i, sample) in pb.sample.iter().enumerate() {
        let stack = stack(sample, &slots, &locations, &strings, &mut clamped, budget)
            .with_context(|| format!("sample {i}"))?;
        add(&mut p.totals, &stack.counts);
        p.stacks.push(stack);
    }
    // As a trace's report: largest in-use first, then largest allocated.
    p.stacks.sort_by(|a, b| {
        (b.counts.inuse_bytes, b.counts.alloc_bytes)
            .cmp(&(a.counts.inuse_bytes, a.counts.alloc_bytes))
    });
    notes.push(Note::ReadFromPprof);
    if clamped > 0 {
        notes.push(Note::NegativeSamples { values: clamped });
    }
    p.notes = notes;
    Ok(p)
}

/// The decoded protobuf, its cost spent first; `bytes` are freed once
/// decoded.
fn decode(bytes: Vec<u8>, budget: &mut Budget) -> anyhow::Result<proto::Profile> {
    let not_pprof = || {
        format!(
            "it is neither memtrace-bpf JSON nor a pprof profile (gzip-compressed or not); it \
             starts with the bytes {}",
            input::first_bytes(&bytes)
        )
    };
    let size = pb_scan::decoded_size(&bytes).with_context(not_pprof)?;
    budget.spend(size)?;
    proto::Profile::decode(&bytes[..])
        .context("its protobuf is malformed (not a pprof profile)")
        .with_context(not_pprof)
}

/// Looks up string-table entries, checking the index.
struct Strings<'a>(&'a [String]);

impl Strings<'_> {
    fn get(&self, i: i64) -> anyhow::Result<&str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.0.get(i))
            .map(String::as_str)
            .with_context(|| {
                format!(
                    "string index {i} is out of range (the string table has {} entries)",
                    self.0.len()
                )
            })
    }
}

/// The slot of each sample value, in order; types we cannot map are
/// ignored with a note, and a profile with none we can is refused.
fn sample_slots(
    pb: &proto::Profile,
    strings: &Strings<'_>,
    notes: &mut Vec<Note>,
) -> anyhow::Result<Vec<Option<Slot>>> {
    let mut slots = Vec::with_capacity(pb.sample_type.len());
    let mut names = Vec::new();
    for t in &pb.sample_type {
        let name = strings.get(t.r#type).context("a sample type")?;
        let unit = strings.get(t.unit).context("a sample type")?;
        let s = slot(name);
        if s.is_none() {
            notes.push(Note::IgnoredSampleType {
                name: name.to_string(),
                unit: unit.to_string(),
            });
        }
        names.push(format!("{name}/{unit}"));
        slots.push(s);
    }
    if slots.iter().all(Option::is_none) {
        bail!(
            "none of its sample types ({}) is a heap number memtrace-bpf reads (inuse_space, \
             inuse_objects, alloc_space, alloc_objects, or jemalloc's space and objects)",
            names.join(", ")
        );
    }
    Ok(slots)
}

/// Function id → (name, file).
fn functions<'a>(
    pb: &'a proto::Profile,
    strings: &Strings<'a>,
    budget: &mut Budget,
) -> anyhow::Result<HashMap<u64, (String, Option<String>)>> {
    let mut out = HashMap::with_capacity(pb.function.len());
    for f in &pb.function {
        let name = strings
            .get(f.name)
            .with_context(|| format!("function {}", f.id))?;
        let file = strings
            .get(f.filename)
            .with_context(|| format!("function {}", f.id))?;
        budget.spend(name.len() + file.len())?;
        let file = (!file.is_empty()).then(|| file.to_string());
        out.insert(f.id, (name.to_string(), file));
    }
    Ok(out)
}

/// A location's frames, innermost first (pprof lists inlined functions
/// before the function they were inlined into).
fn location_frames(
    loc: &proto::Location,
    functions: &HashMap<u64, (String, Option<String>)>,
    mappings: &HashMap<u64, &proto::Mapping>,
    strings: &Strings<'_>,
    budget: &mut Budget,
) -> anyhow::Result<Vec<Arc<Frame>>> {
    // A file offset: the address less where its mapping puts the file.
    let offset = match mappings.get(&loc.mapping_id) {
        Some(m) => loc
            .address
            .checked_sub(m.memory_start)
            .and_then(|a| a.checked_add(m.file_offset))
            .unwrap_or(loc.address),
        None => loc.address,
    };
    let (module, build_id) = match mappings.get(&loc.mapping_id) {
        Some(m) => (
            strings.get(m.filename).context("its mapping")?.to_string(),
            Some(strings.get(m.build_id).context("its mapping's build id")?)
                .filter(|id| !id.is_empty())
                .map(Arc::<str>::from),
        ),
        None => (String::new(), None),
    };
    budget.spend(build_id.as_deref().map_or(0, str::len))?;
    if loc.line.is_empty() {
        budget.spend(module.len())?;
        return Ok(vec![Arc::new(Frame {
            function: "[unknown]".into(),
            module,
            offset,
            build_id,
            ..Default::default()
        })]);
    }
    let last = loc.line.len() - 1;
    loc.line
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let (name, file) = functions.get(&line.function_id).with_context(|| {
                format!("function id {} is not in the profile", line.function_id)
            })?;
            // Each line copies its names (the frame itself is in pb_scan's count).
            budget.spend(name.len() + module.len() + file.as_ref().map_or(0, String::len))?;
            Ok(Arc::new(Frame {
                function: name.clone(),
                module: module.clone(),
                offset,
                file: file.clone(),
                line: u32::try_from(line.line).ok().filter(|&l| l > 0),
                inlined: i < last,
                build_id: build_id.clone(),
            }))
        })
        .collect()
}

/// The sampling period when it is in bytes (`space/bytes`), else 0.
fn sample_rate(pb: &proto::Profile, strings: &Strings<'_>) -> u64 {
    let space = pb
        .period_type
        .as_ref()
        .and_then(|t| strings.get(t.unit).ok())
        .is_some_and(|unit| unit == "bytes");
    match space {
        true => u64::try_from(pb.period).unwrap_or(0),
        false => 0,
    }
}

fn stack(
    sample: &proto::Sample,
    slots: &[Option<Slot>],
    locations: &HashMap<u64, Vec<Arc<Frame>>>,
    strings: &Strings<'_>,
    clamped: &mut u64,
    budget: &mut Budget,
) -> anyhow::Result<StackReport> {
    if sample.value.len() != slots.len() {
        bail!(
            "it has {} values for {} sample types",
            sample.value.len(),
            slots.len()
        );
    }
    let mut counts = Counts::default();
    for (&v, slot) in sample.value.iter().zip(slots) {
        let v = u64::try_from(v).unwrap_or_else(|_| {
            *clamped += 1;
            0
        });
        match slot {
            Some(Slot::InuseBytes) => counts.inuse_bytes = v,
            Some(Slot::InuseObjects) => counts.inuse_objects = v,
            Some(Slot::AllocBytes) => counts.alloc_bytes = v,
            Some(Slot::AllocObjects) => counts.alloc_objects = v,
            Some(Slot::PeakBytes) => counts.peak_inuse_bytes = v,
            Some(Slot::PeakObjects) => counts.peak_inuse_objects = v,
            None => {}
        }
    }
    let mut frames = Vec::new();
    for id in &sample.location_id {
        let loc = locations
            .get(id)
            .with_context(|| format!("location id {id} is not in the profile"))?;
        // A location of many lines, referenced many times, multiplies:
        // spend before holding it again.
        budget.spend(loc.len().saturating_mul(limits::REFERENCE_COST))?;
        frames.extend(loc.iter().cloned());
    }
    Ok(StackReport {
        pid: pid_label(sample, strings),
        counts,
        frames: frames.into(),
        ..Default::default()
    })
}

/// Our own files carry the process as a numeric `pid` label.
fn pid_label(sample: &proto::Sample, strings: &Strings<'_>) -> u32 {
    sample
        .label
        .iter()
        .find(|l| strings.get(l.key).is_ok_and(|k| k == "pid"))
        .and_then(|l| u32::try_from(l.num).ok())
        .unwrap_or(0)
}
