//! The few facts about the running kernel's structures that BPF programs
//! need and cannot get by themselves: Rust BPF has no CO-RE relocations, so
//! field offsets are read from the kernel's BTF (/sys/kernel/btf/vmlinux)
//! here and handed to the programs as load-time globals.
//!
//! A minimal reader of the BTF format (Documentation/bpf/btf.rst): a
//! header, a type section of variable-length records, a string section.
//! aya-obj parses BTF too, but keeps struct members private.

use anyhow::{bail, Context as _};

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
/// A FUNC's `vlen` is its linkage: 0 static, 1 global, 2 extern.
const FUNC_GLOBAL: u32 = 1;
const MEMORY_BUILTINS: [&str; 4] = ["memset", "memcpy", "memmove", "memcmp"];
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// What the fork and exit programs need to know about this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskFacts {
    /// Byte offset of `tgid` in `struct task_struct`.
    pub tgid_offset: u32,
    /// Byte offset of `start_boottime` in `struct task_struct` (0: none).
    pub start_offset: u32,
    /// Whether the sched_process_exit tracepoint passes `group_dead` (its
    /// second argument, since Linux 6.16), true when the last thread of a
    /// process exits.
    pub exit_has_group_dead: bool,
}

/// Reads the facts from the running kernel's BTF.
pub fn task_facts() -> anyhow::Result<TaskFacts> {
    let path = "/sys/kernel/btf/vmlinux";
    let data = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    let btf = Btf::parse(&data).with_context(|| format!("parsing {path}"))?;
    let tgid_offset = btf
        .member_offset("task_struct", "tgid")
        .context("the kernel's BTF has no task_struct.tgid")?;
    let exit_args = btf.tracepoint_args("sched_process_exit").unwrap_or(1);
    Ok(TaskFacts {
        tgid_offset,
        start_offset: btf
            .member_offset("task_struct", "start_boottime")
            .unwrap_or(0),
        exit_has_group_dead: exit_args >= 2,
    })
}

/// One type record: kind, name, `size` or `type` word, and the offset of
/// what follows the 12-byte header.
#[derive(Clone, Copy)]
struct Type {
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    name: u32,
    size_or_type: u32,
    extra: usize,
}

pub struct Btf<'a> {
    data: &'a [u8],
    strings: &'a [u8],
    /// Index = type id - 1 (id 0 is void).
    types: Vec<Type>,
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> anyhow::Result<Btf<'a>> {
        if u16_at(data, 0)? != MAGIC {
            bail!("not BTF (or not little-endian)");
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let field = |off: usize| u32_at(data, off).map(|v| v as usize);
        let (type_off, type_len) = (hdr_len + field(8)?, field(12)?);
        let (str_off, str_len) = (hdr_len + field(16)?, field(20)?);
        let strings = data
            .get(str_off..str_off + str_len)
            .context("string section out of bounds")?;
        let end = type_off + type_len;
        if end > data.len() {
            bail!("type section out of bounds");
        }
        let mut types = Vec::new();
        let mut at = type_off;
        while at < end {
            let info = u32_at(data, at + 4)?;
            let ty = Type {
                kind: (info >> 24) & 0x1f,
                vlen: info & 0xffff,
                kind_flag: info >> 31 != 0,
                name: u32_at(data, at)?,
                size_or_type: u32_at(data, at + 8)?,
                extra: at + 12,
            };
            at = ty.extra + trailer_len(ty.kind, ty.vlen);
            types.push(ty);
        }
        Ok(Btf {
            data,
            strings,
            types,
        })
    }

    fn name(&self, offset: u32) -> &'a [u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        rest.split(|&b| b == 0).next().unwrap_or_default()
    }

    fn by_id(&self, id: u32) -> Option<Type> {
        self.types.get((id as usize).checked_sub(1)?).copied()
    }

    fn find(&self, kind: u32, name: &str) -> Option<Type> {
        self.types
            .iter()
            .find(|t| t.kind == kind && self.name(t.name) == name.as_bytes())
            .copied()
    }

    /// Byte offset of `member` in struct `name`, looking into anonymous
    /// structs and unions (as C does).
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        let ty = self.find(KIND_STRUCT, name)?;
        self.find_member(ty, member.as_bytes(), 0)
            .map(|bits| bits / 8)
    }

    fn find_member(&self, ty: Type, member: &[u8], base_bits: u32) -> Option<u32> {
        for i in 0..ty.vlen as usize {
            let at = ty.extra + 12 * i;
            let (name, member_type, offset) = (
                u32_at(self.data, at).ok()?,
                u32_at(self.data, at + 4).ok()?,
                u32_at(self.data, at + 8).ok()?,
            );
            // With kind_flag the high byte is a bitfield's size.
            let bits = base_bits
                + if ty.kind_flag {
                    offset & 0xff_ffff
                } else {
                    offset
                };
            if self.name(name) == member {
                return Some(bits);
            }
            if name == 0 {
                let inner = self.by_id(member_type)?;
                if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                    if let Some(found) = self.find_member(inner, member, bits) {
                        return Some(found);
                    }
                }
            }
        }
        None
    }

    /// The type id of function `name` (a kfunc's id for a call).
    pub fn function_id(&self, name: &str) -> Option<u32> {
        let at = self
            .types
            .iter()
            .position(|t| t.kind == KIND_FUNC && self.name(t.name) == name.as_bytes())?;
        u32::try_from(at + 1).ok()
    }

    /// Whether any enum has an enumerator called `name` (the kernel's BTF
    /// lists `enum bpf_map_type`, `bpf_func_id` and `bpf_attach_type`:
    /// what this kernel's BPF offers, by name).
    pub fn has_enumerator(&self, name: &str) -> bool {
        self.types.iter().any(|t| {
            let stride = match t.kind {
                KIND_ENUM => 8,
                KIND_ENUM64 => 12,
                _ => return false,
            };
            (0..t.vlen as usize).any(|i| {
                u32_at(self.data, t.extra + stride * i)
                    .is_ok_and(|n| self.name(n) == name.as_bytes())
            })
        })
    }

    /// Where, in this BTF blob, the map type of the BTF-defined map
    /// variable `var` is written: the element count of the array its
    /// `type` member points to (`__uint(type, N)` is `int (*type)[N]`).
    pub fn map_type_offset(&self, var: &str) -> Option<usize> {
        let var = self.find(KIND_VAR, var)?;
        let mut def = self.by_id(var.size_or_type)?;
        while def.kind == KIND_TYPEDEF || def.kind == KIND_VOLATILE || def.kind == KIND_CONST {
            def = self.by_id(def.size_or_type)?;
        }
        if def.kind != KIND_STRUCT {
            return None;
        }
        let member_type = (0..def.vlen as usize).find_map(|i| {
            let at = def.extra + 12 * i;
            let name = u32_at(self.data, at).ok()?;
            (self.name(name) == b"type").then(|| u32_at(self.data, at + 4).ok())?
        })?;
        let ptr = self.by_id(member_type)?;
        let array = self.by_id(ptr.size_or_type)?;
        (ptr.kind == KIND_PTR && array.kind == KIND_ARRAY).then_some(array.extra + 8)
    }

    /// If function `name`'s linkage is global (BTF_FUNC_GLOBAL), which the
    /// verifier checks on its own, once, from its prototype: how many
    /// parameters it takes. `Err` for one whose parameters are not all
    /// integers, which the session copies' BTF (session_btf.rs) does not
    /// describe. The memory builtins count as static whatever their
    /// linkage, as aya makes them: bound facts of the caller must reach
    /// them.
    pub fn global_function_params(&self, name: &str) -> anyhow::Result<Option<u32>> {
        if MEMORY_BUILTINS.contains(&name) {
            return Ok(None);
        }
        let Some(func) = self.find(KIND_FUNC, name) else {
            return Ok(None);
        };
        if func.vlen != FUNC_GLOBAL {
            return Ok(None);
        }
        let Some(proto) = self.by_id(func.size_or_type) else {
            return Ok(Some(0));
        };
        for i in 0..proto.vlen as usize {
            // A parameter: name, type.
            let ty = u32_at(self.data, proto.extra + 8 * i + 4)?;
            if self.by_id(ty).map(|t| t.kind) != Some(KIND_INT) {
                bail!("global BPF function {name} takes a parameter that is not an integer");
            }
        }
        Ok(Some(proto.vlen))
    }

    /// How many arguments a raw tracepoint passes to BPF programs: the
    /// parameters of `btf_trace_NAME` (a typedef of a pointer to a function
    /// whose first parameter is the BPF context) minus that context.
    pub fn tracepoint_args(&self, tracepoint: &str) -> Option<u32> {
        let typedef = self.find(KIND_TYPEDEF, &format!("btf_trace_{tracepoint}"))?;
        let ptr = self.by_id(typedef.size_or_type)?;
        let proto = self.by_id(ptr.size_or_type)?;
        (ptr.kind == KIND_PTR && proto.kind == KIND_FUNC_PROTO)
            .then(|| proto.vlen.saturating_sub(1))
    }
}

/// Bytes that follow a type's 12-byte header, by kind.
fn trailer_len(kind: u32, vlen: u32) -> usize {
    let vlen = vlen as usize;
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        _ => 0,
    }
}

fn u32_at(data: &[u8], at: usize) -> anyhow::Result<u32> {
    let bytes = data.get(at..at + 4).context("truncated BTF")?;
    Ok(u32::from_le_bytes(bytes.try_into()?))
}

fn u16_at(data: &[u8], at: usize) -> anyhow::Result<u16> {
    let bytes = data.get(at..at + 2).context("truncated BTF")?;
    Ok(u16::from_le_bytes(bytes.try_into()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `types` (each a header word triple plus trailer
    /// words) and `strings` (NUL-separated, starting with the empty name).
    fn blob(types: &[&[u32]], strings: &[u8]) -> Vec<u8> {
        let type_bytes: Vec<u8> = types
            .iter()
            .flat_map(|t| t.iter().flat_map(|w| w.to_le_bytes()))
            .collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for word in [24u32, 0, type_bytes.len() as u32, type_bytes.len() as u32] {
            out.extend(word.to_le_bytes());
        }
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    fn info(kind: u32, vlen: u32, kind_flag: bool) -> u32 {
        (u32::from(kind_flag) << 31) | (kind << 24) | vlen
    }

    // Strings: 1 "int", 5 "task_struct", 17 "pid", 21 "tgid", 26 "u",
    // 28 "btf_trace_sched_process_exit".
    const STRINGS: &[u8] = b"\0int\0task_struct\0pid\0tgid\0u\0btf_trace_sched_process_exit\0";

    #[test]
    fn finds_a_member_through_an_anonymous_union_and_bitfield_offsets() {
        let types: &[&[u32]] = &[
            // 1: int
            &[1, info(KIND_INT, 0, false), 4, 32],
            // 2: an anonymous union { int tgid; }.
            &[0, info(KIND_UNION, 1, false), 4, 21, 1, 0],
            // 3: struct task_struct { int pid @ bit 64; union @ bit 96 },
            // kind_flag set: offsets carry a bitfield size in the high byte.
            &[
                5,
                info(KIND_STRUCT, 2, true),
                16,
                17,
                1,
                64,
                0,
                2,
                (7 << 24) | 96,
            ],
        ];
        let data = blob(types, STRINGS);
        let btf = Btf::parse(&data).expect("parse");
        assert_eq!(btf.member_offset("task_struct", "pid"), Some(8));
        assert_eq!(btf.member_offset("task_struct", "tgid"), Some(12));
        assert_eq!(btf.member_offset("task_struct", "nope"), None);
        assert_eq!(btf.member_offset("mm_struct", "pid"), None);
    }

    #[test]
    fn counts_a_tracepoints_arguments_without_the_context() {
        let types: &[&[u32]] = &[
            &[1, info(KIND_INT, 0, false), 4, 32],
            // 2: int *
            &[0, info(KIND_PTR, 0, false), 1],
            // 3: proto (void *ctx, int *p, int group_dead)
            &[0, info(KIND_FUNC_PROTO, 3, false), 0, 0, 2, 0, 2, 0, 1],
            // 4: pointer to 3; 5: typedef of 4
            &[0, info(KIND_PTR, 0, false), 3],
            &[28, info(KIND_TYPEDEF, 0, false), 4],
        ];
        let data = blob(types, STRINGS);
        let btf = Btf::parse(&data).expect("parse");
        assert_eq!(btf.tracepoint_args("sched_process_exit"), Some(2));
        assert_eq!(btf.tracepoint_args("sched_process_fork"), None);
    }

    #[test]
    fn refuses_truncated_or_foreign_data() {
        assert!(Btf::parse(b"").is_err());
        assert!(Btf::parse(b"\x9f\xeb").is_err());
        let mut data = blob(&[&[1, info(KIND_INT, 0, false), 4, 32]], STRINGS);
        data.truncate(30);
        assert!(Btf::parse(&data).is_err());
    }

    #[test]
    fn the_running_kernel_has_task_struct_tgid_after_pid() {
        // Every kernel this tool supports has BTF (preflight checks it).
        let facts = task_facts().expect("kernel BTF");
        let data = std::fs::read("/sys/kernel/btf/vmlinux").expect("vmlinux BTF");
        let btf = Btf::parse(&data).expect("parse");
        let pid = btf.member_offset("task_struct", "pid").expect("pid");
        assert_eq!(facts.tgid_offset, pid + 4, "pid_t pid; pid_t tgid;");
        let start = btf
            .member_offset("task_struct", "start_time")
            .expect("start_time");
        assert_eq!(
            facts.start_offset,
            start + 8,
            "u64 start_time; u64 start_boottime;"
        );
    }
}
