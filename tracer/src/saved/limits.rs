//! What reading a saved profile may cost, and which numbers in it are
//! believable. A saved file is as hostile as anything a traced process
//! controls: a 2 MB gzip bomb or a few KB of pprof that repeats one
//! location must be refused while it is read, before it has cost more than
//! these bounds, and a number that would overflow or print as nonsense
//! further on (a negative age, a duration of 1e308 s, counts that sum past
//! what pprof's int64 holds) is refused with the field it came from.

use anyhow::{bail, Context as _};

use crate::profile::{Identity, KernelMemory, ProcessInfo};
use crate::report::{Counts, Profile};

/// Largest saved file read, and largest it may decompress to: 128 MiB.
/// A trace's JSON of 100,000 stacks is about 40 MB; Go's heap profiles are
/// a few MB.
pub const MAX_INPUT_BYTES: u64 = 128 << 20;

/// Most memory the parsed profile may take, estimated while reading (see
/// `Budget`), the input bytes included: 4 times `MAX_INPUT_BYTES`, 512
/// MiB. A trace's JSON is estimated at about 3.3 times its size: each
/// frame reference is 5 to 7 bytes of text (an index into a table of
/// thousands of frames, as a file this large has) and is counted at 20
/// more (the index read, the pointer it becomes, a renderer's id), and
/// each stack at a few hundred bytes for 200 of text. So whatever a trace
/// writes up to `MAX_INPUT_BYTES` is read (a unit test checks the ratio
/// on a file shaped like the 73 MB one cc1plus gave, which 185 MiB read).
/// Files that reference much more densely than a trace writes, as a pprof
/// repeating one location of thousands of lines, are refused.
pub const MAX_PROFILE_BYTES: usize = 4 * MAX_INPUT_BYTES as usize;

/// Most folded text a flamegraph of a saved profile (or of a diff) is
/// drawn from: 256 MiB. inferno draws from whole `root;...;leaf` lines, so
/// unlike the other renderers the flamegraph spells every frame's name out
/// once per stack that holds it; a profile of 7 M frame references takes
/// several hundred MiB of such text.
pub const MAX_FLAMEGRAPH_TEXT: usize = 256 << 20;

/// Refuses a flamegraph that would be drawn from more than
/// `MAX_FLAMEGRAPH_TEXT` bytes of folded stacks, saying what to do instead.
pub fn check_flamegraph_text(bytes: usize) -> anyhow::Result<()> {
    if bytes > MAX_FLAMEGRAPH_TEXT {
        bail!(
            "a flamegraph of this profile would be drawn from {} MiB of folded stacks (inferno \
             draws from whole lines, every frame's name spelled out per stack), more than the {} \
             MiB memtrace-bpf draws from: use --format collapsed and draw it with \
             inferno-flamegraph or flamegraph.pl, or --format pprof or speedscope, which name \
             each frame once",
            bytes >> 20,
            MAX_FLAMEGRAPH_TEXT >> 20
        );
    }
    Ok(())
}

/// Largest count (bytes, objects, losses) or sum of counts read: pprof
/// stores them as int64 and `diff` subtracts them.
pub const MAX_COUNT: u64 = i64::MAX as u64;

/// Longest duration or snapshot time read: 100 years.
pub const MAX_SECS: f64 = 100.0 * 365.0 * 24.0 * 3600.0;

/// The memory a profile being read may still take. Readers spend from it
/// before they allocate, so a file is refused as soon as it would cross
/// `MAX_PROFILE_BYTES`, not after.
pub struct Budget {
    left: usize,
    limit: usize,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget { left: limit, limit }
    }

    /// What has been spent so far.
    #[cfg(test)]
    pub fn spent(&self) -> usize {
        self.limit - self.left
    }

    pub fn spend(&mut self, bytes: usize) -> anyhow::Result<()> {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => bail!(
                "reading it would take more than {} MiB of memory, the most memtrace-bpf spends \
                 on a saved profile (a profile this large, or repeating so much, is not one a \
                 trace writes)",
                self.limit >> 20
            ),
        }
    }
}

/// Refuses a profile with a number out of range; the error names the field.
pub fn check(p: &Profile) -> anyhow::Result<()> {
    secs(p.duration_secs, MAX_SECS).context("duration_secs")?;
    if let Some(ns) = p.start_unix_ns {
        count(ns).context("start_unix_ns")?;
    }
    for (i, proc) in p.processes.iter().enumerate() {
        process(proc).with_context(|| format!("process {i} (pid {})", proc.pid))?;
    }
    if let Some(age) = p.min_age_secs {
        secs(age, crate::limits::MAX_DURATION_SECS).context("min_age_secs")?;
    }
    if p.sample_rate > crate::limits::MAX_SAMPLE_RATE {
        bail!(
            "sample rate {} is out of range (a trace samples at most every {} bytes)",
            p.sample_rate,
            crate::limits::MAX_SAMPLE_RATE
        );
    }
    let mut sum = Counts::default();
    for (i, s) in p.stacks.iter().enumerate() {
        counts(&s.counts).with_context(|| format!("stack {i}"))?;
        add(&mut sum, &s.counts);
        for &v in &s.series {
            count(v).with_context(|| format!("stack {i}: series"))?;
        }
        if let Some(rate) = s.growth_bytes_per_sec {
            if !(rate.is_finite() && rate.abs() <= MAX_COUNT as f64) {
                bail!("stack {i}: growth_bytes_per_sec {rate:?} is out of range");
            }
        }
    }
    counts(&sum).context("the stacks' counts summed")?;
    counts(&p.totals).context("totals")?;
    for (i, s) in p.snapshots.iter().enumerate() {
        secs(s.secs, MAX_SECS).with_context(|| format!("snapshot {i}: secs"))?;
        for v in [s.inuse_bytes, s.inuse_objects, s.alloc_bytes] {
            count(v).with_context(|| format!("snapshot {i}"))?;
        }
        if let Some(v) = s.resident_bytes {
            count(v).with_context(|| format!("snapshot {i}: resident_bytes"))?;
        }
    }
    if let Some(m) = &p.cgroup_memory {
        kernel_memory(m).context("cgroup_memory")?;
    }
    let at_exit = &p.not_freed_at_exit;
    let mut exit_sum = [at_exit.processes, at_exit.bytes, at_exit.objects];
    for s in &at_exit.stacks {
        for (sum, v) in exit_sum.iter_mut().zip([s.processes, s.bytes, s.objects]) {
            *sum = sum.saturating_add(v);
        }
    }
    for v in exit_sum {
        count(v).context("not_freed_at_exit")?;
    }
    let lines = p.losses.lines();
    for l in &lines {
        count(l.count).with_context(|| format!("losses: {}", l.name))?;
    }
    let sum = lines.iter().fold(0, |a: u64, l| a.saturating_add(l.count));
    count(sum).context("losses summed")
}

/// A process's times, counts and names that have a known shape: a time
/// outside the trace or an id that is not one would be shown as fact.
fn process(p: &ProcessInfo) -> anyhow::Result<()> {
    if let Some(peak) = &p.peak {
        if let Some(at) = peak.secs {
            secs(at, MAX_SECS).context("peak.secs")?;
        }
        for v in [peak.inuse_bytes, peak.inuse_objects] {
            count(v).context("peak")?;
        }
    }
    if let Some(oom) = &p.oom_killed {
        secs(oom.secs, MAX_SECS).context("oom_killed.secs")?;
        for v in [oom.inuse_bytes, oom.inuse_objects] {
            count(v).context("oom_killed")?;
        }
    }
    if let Some(m) = &p.memory {
        kernel_memory(m).context("memory")?;
    }
    let id = &p.identity;
    if let Some(c) = id
        .container_id
        .as_deref()
        .filter(|c| !Identity::is_container_id(c))
    {
        bail!(
            "container_id \"{}\" is not a container id (12 to 64 hex digits)",
            shortened(c)
        );
    }
    if let Some(u) = id.pod_uid.as_deref().filter(|u| !Identity::is_pod_uid(u)) {
        bail!(
            "pod_uid \"{}\" is not a pod UID (8-4-4-4-12 hex digits)",
            shortened(u)
        );
    }
    Ok(())
}

/// The kernel's readings and the growth worked out from them: times in
/// the trace, counts in range, a share a share.
fn kernel_memory(m: &KernelMemory) -> anyhow::Result<()> {
    for (name, r) in [("start", &m.start), ("peak", &m.peak), ("end", &m.end)] {
        secs(r.secs, MAX_SECS).with_context(|| format!("{name}.secs"))?;
        for v in [r.resident_bytes, r.anon_bytes, r.file_bytes, r.swap_bytes] {
            count(v).with_context(|| name.to_string())?;
        }
    }
    if let Some(g) = &m.growth {
        let signed = [
            g.resident_growth_bytes,
            g.anon_growth_bytes,
            g.file_growth_bytes,
            g.heap_growth_bytes,
        ];
        for v in signed {
            count(v.unsigned_abs()).context("growth")?;
        }
        for v in [g.allocator_retained_bytes, g.other_anon_bytes] {
            count(v).context("growth")?;
        }
        if let Some(share) = g.heap_share.filter(|s| !(0.0..=1.0).contains(s)) {
            bail!("growth.heap_share {share:?} is not a share (0 to 1)");
        }
    }
    Ok(())
}

/// The first 80 characters of a value quoted in an error (a hostile file's
/// value may be megabytes); escaped where the error is printed.
fn shortened(v: &str) -> String {
    match v.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_string(),
    }
}

fn secs(v: f64, max: f64) -> anyhow::Result<()> {
    if !(v.is_finite() && (0.0..=max).contains(&v)) {
        // `{:?}`: 1e308 rather than 309 digits.
        bail!("{v:?} s is out of range (from 0 to {max:?} s)");
    }
    Ok(())
}

fn count(v: u64) -> anyhow::Result<()> {
    if v > MAX_COUNT {
        bail!("{v} is out of range (counts go up to 2^63 - 1 = {MAX_COUNT})");
    }
    Ok(())
}

fn counts(c: &Counts) -> anyhow::Result<()> {
    for v in [
        c.inuse_bytes,
        c.inuse_objects,
        c.alloc_bytes,
        c.alloc_objects,
        c.peak_inuse_bytes,
        c.peak_inuse_objects,
    ] {
        count(v)?;
    }
    Ok(())
}

/// Saturating, so a sum past `MAX_COUNT` stays past it.
pub fn add(total: &mut Counts, c: &Counts) {
    total.inuse_bytes = total.inuse_bytes.saturating_add(c.inuse_bytes);
    total.inuse_objects = total.inuse_objects.saturating_add(c.inuse_objects);
    total.alloc_bytes = total.alloc_bytes.saturating_add(c.alloc_bytes);
    total.alloc_objects = total.alloc_objects.saturating_add(c.alloc_objects);
    total.peak_inuse_bytes = total.peak_inuse_bytes.saturating_add(c.peak_inuse_bytes);
    total.peak_inuse_objects = total
        .peak_inuse_objects
        .saturating_add(c.peak_inuse_objects);
}

/// What each reference to a frame in a stack costs the renderers that go
/// through every stack: a 4-byte name id (collapsed, speedscope, `diff`).
/// A frame's names are spent once, where the frame is read; the
/// flamegraph, which spells them out per reference, has its own bound
/// (`MAX_FLAMEGRAPH_TEXT`).
pub const RENDER_COST: usize = std::mem::size_of::<u32>();

/// What one more reference to a frame costs in all: the pointer the
/// profile holds, and `RENDER_COST`. (JSON counts the pointer with the
/// element it is read from, `read_json::decoded_size`.)
pub const REFERENCE_COST: usize = std::mem::size_of::<usize>() + RENDER_COST;
