//! What the fuzz targets in `fuzz/` run (cargo-fuzz, `cargo xtask fuzz`),
//! and the inputs they found, kept as regression tests. Each function takes
//! arbitrary bytes, as a hostile traced process could supply them, and must
//! neither panic nor take unbounded time or memory.

use iced_x86::Register;

use crate::{
    probes::placement,
    tracee::{elf::ObjectInfo, ld_so_conf::ld_so_conf_lines, process},
};

/// ELF symbol, PLT-thunk and dynamic-section discovery on any file.
pub fn elf(data: &[u8]) {
    if let Ok(info) = ObjectInfo::from_bytes(data) {
        let _ = info.defines_malloc_and_free();
    }
}

/// A /proc/PID/maps text (paths are whatever the process mapped).
pub fn maps(data: &[u8]) {
    let _ = process::parse_maps(data);
}

/// An ld.so.conf text from a process's root directory.
pub fn ld_so_conf(data: &[u8]) {
    let _ = ld_so_conf_lines(data);
}

/// The probe-placement decoder on any function body: the first byte picks
/// which argument registers the probe reads and whether moves are allowed.
pub fn placement(data: &[u8]) {
    let Some((&flags, code)) = data.split_first() else {
        return;
    };
    let args: Vec<Register> = placement::ARG_REGISTERS
        .iter()
        .enumerate()
        .filter(|(i, _)| flags & (1 << i) != 0)
        .map(|(_, &r)| r)
        .collect();
    let code = &code[..code.len().min(placement::MAX_FUNCTION)];
    let _ = placement::place_with(code, &args, flags & 0x80 != 0);
}

/// A saved profile as `report` and `diff` read it (gzip, JSON or pprof),
/// then rendered as text and diffed with itself.
pub fn saved(data: &[u8]) {
    if let Ok(p) = crate::saved::load_bytes(data) {
        let _ = crate::report::write_text(&p, 10, &mut std::io::sink());
        let d = crate::saved::Diff::new(&p, &p, "old", "new");
        let _ = d.write_text(crate::report::View::InuseSpace, 10, &mut std::io::sink());
    }
}

/// The targets by name, as `fuzz/fuzz_targets/NAME.rs` and the regression
/// folders `tracer/fuzz-regressions/NAME/` name them.
pub type Target = fn(&[u8]);

pub const TARGETS: &[(&str, Target)] = &[
    ("elf", elf),
    ("maps", maps),
    ("ld_so_conf", ld_so_conf),
    ("placement", placement),
    ("saved", saved),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every input a fuzz run kept (crashes, and a seed or two per target)
    /// still runs through its target without panicking.
    #[test]
    fn regression_inputs_run_clean() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-regressions");
        let mut ran = 0;
        for (name, run) in TARGETS {
            let Ok(entries) = std::fs::read_dir(root.join(name)) else {
                continue;
            };
            for entry in entries.flatten() {
                let data = std::fs::read(entry.path()).expect("read regression input");
                run(&data);
                ran += 1;
            }
        }
        assert!(ran > 0, "no regression inputs under {}", root.display());
    }

    #[test]
    fn targets_take_empty_and_garbage_input() {
        for (_, run) in TARGETS {
            run(&[]);
            run(&[0xff; 64]);
            run(b"\x7fELF\x02\x01\x01\0garbage");
        }
    }
}
