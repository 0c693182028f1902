//! Unwinding recorded samples (MEMTRACE_RECORD_SAMPLES) of
//! tests/targets/sites.c built with `-O2 -fomit-frame-pointer`; the
//! binary and the samples are checked in under tests/fixtures/unwind.

use std::path::Path;

use object::{Object as _, ObjectSymbol as _};

use super::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/unwind");

/// The fixture's files by their identity on disk, as `Modules` gives them.
fn fixture_file(m: &Mapping) -> Option<(FileKey, PathBuf)> {
    use std::os::unix::fs::MetadataExt as _;
    let path = Path::new(DIR).join(&m.path);
    let meta = std::fs::metadata(&path).ok()?;
    Some(((meta.dev(), meta.ino()), path))
}

struct Fixture {
    maps: Vec<Mapping>,
    ip: u64,
    sp: u64,
    bp: u64,
    stack: Vec<u8>,
    expect_functions: Vec<String>,
}

fn fixtures() -> Vec<Fixture> {
    let text = std::fs::read_to_string(Path::new(DIR).join("samples.json")).expect("samples");
    let all: serde_json::Value = serde_json::from_str(&text).expect("samples are JSON");
    let u = |v: &serde_json::Value| v.as_u64().expect("number");
    all.as_array()
        .expect("array")
        .iter()
        .map(|s| Fixture {
            maps: s["maps"]
                .as_array()
                .expect("maps")
                .iter()
                .map(|m| Mapping {
                    start: u(&m["start"]),
                    end: u(&m["end"]),
                    offset: u(&m["offset"]),
                    executable: m["executable"].as_bool().expect("bool"),
                    path: m["path"].as_str().expect("path").to_string(),
                    dev_inode: (0, 0),
                })
                .collect(),
            ip: u(&s["ip"]),
            sp: u(&s["sp"]),
            bp: u(&s["bp"]),
            stack: hex(s["stack"].as_str().expect("hex")),
            expect_functions: s["expect_functions"]
                .as_array()
                .expect("names")
                .iter()
                .map(|n| n.as_str().expect("name").to_string())
                .collect(),
        })
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex byte"))
        .collect()
}

/// The function containing return address `addr` in the fixture binary.
fn function_at(maps: &[Mapping], addr: u64) -> String {
    let data = std::fs::read(Path::new(DIR).join("sites-O2")).expect("binary");
    let file = object::File::parse(&*data).expect("ELF");
    let sections = Sections::parse(&data).expect("sections");
    let m = maps
        .iter()
        .find(|m| (m.start..m.end).contains(&(addr - 1)))
        .expect("address in the binary");
    let svma = addr - 1 - sections.bias(m).expect("bias");
    file.symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text)
        .find(|s| (s.address()..s.address() + s.size()).contains(&svma))
        .and_then(|s| s.name().ok().map(str::to_string))
        .unwrap_or_default()
}

fn unwind(f: &Fixture, stack: &[u8]) -> Unwound {
    let mut u = Unwinders::default();
    let sample = Sample {
        ip: f.ip,
        sp: f.sp,
        bp: f.bp,
        stack,
    };
    u.unwind(1, &f.maps, &JitCode::EMPTY, &sample, &fixture_file)
}

#[test]
fn recorded_samples_unwind_through_the_call_sites_to_main_or_the_thread_routine() {
    let all = fixtures();
    assert_eq!(all.len(), 6, "three sites, main thread and worker");
    for f in &all {
        let got = unwind(f, &f.stack);
        let names: Vec<String> = got
            .addrs
            .iter()
            .take(3)
            .map(|&a| function_at(&f.maps, a))
            .collect();
        assert_eq!(names, f.expect_functions, "addresses {:x?}", got.addrs);
        // The next frame returns into libc, which the fixture lacks.
        assert!(got.addrs.len() >= 4, "{:x?}", got.addrs);
    }
}

#[test]
fn processes_mapping_one_file_share_its_parsed_sections() {
    let f = &fixtures()[0];
    let mut u = Unwinders::default();
    let sample = Sample {
        ip: f.ip,
        sp: f.sp,
        bp: f.bp,
        stack: &f.stack,
    };
    let first = u.unwind(1, &f.maps, &JitCode::EMPTY, &sample, &fixture_file);
    let second = u.unwind(2, &f.maps, &JitCode::EMPTY, &sample, &fixture_file);
    assert_eq!(first, second);
    // Only the fixture binary exists here (its libc does not).
    assert_eq!(u.held(), (2, 1), "two unwinders, one parsed file");
    u.invalidate(1);
    u.invalidate(2);
    u.evict_unused();
    assert_eq!(u.held(), (0, 1), "kept a while for the next process");
}
#[test]
fn a_window_too_small_for_the_stack_is_marked_truncated() {
    let f = &fixtures()[0];
    let got = unwind(f, &f.stack[..8]);
    assert!(got.truncated);
    assert_eq!(
        got.addrs.first(),
        Some(&f.ip),
        "the call site itself is kept"
    );
    assert!(got.addrs.len() < 3, "{:x?}", got.addrs);
}

#[test]
fn an_ip_outside_every_module_gives_a_truncated_one_frame_stack() {
    let mut f = fixtures().remove(0);
    f.ip = 0x10;
    let stack = f.stack.clone();
    let got = unwind(&f, &stack);
    assert!(got.truncated);
    assert_eq!(got.addrs.first(), Some(&0x10));
}

/// CPython's trampolines (`trampolines.rs`) are stepped by their rule, not
/// by the frame-pointer chain (RBP here is garbage, as in Python's eval
/// loop), also after the maps stopped showing them (Python unmaps its
/// arenas as it exits, before late samples are unwound).
#[test]
fn trampolines_are_stepped_by_their_rule_also_once_unmapped() {
    use crate::stacks::trampolines::{Shape, TrampolineSpan};
    const BASE: u64 = 0x7f00_0000_0000;
    let span = TrampolineSpan {
        range: BASE..BASE + 0x10000,
        shape: Shape {
            endbr: false,
            stride: 11,
        },
    };
    let sp = 0x7ffc_0000_1000u64;
    // The stack at `sp`: in the first copy's frame (RSP + 16 at its call)
    // the return address into the second copy, then in its frame one into
    // code nothing maps.
    let words: [u64; 4] = [0, BASE + 11 + 6, 0, 0x1234];
    let stack: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let sample = Sample {
        ip: BASE + 6,
        sp,
        bp: 0xdead_beef,
        stack: &stack,
    };
    let mut jit = JitCode::with(vec![span.range.clone()], vec![span]);
    let want = Unwound {
        addrs: vec![BASE + 6, BASE + 17, 0x1234],
        truncated: true,
    };
    let mut u = Unwinders::default();
    assert_eq!(u.unwind(1, &[], &jit, &sample, &|_| None), want);
    assert!(jit.update_with(Vec::new(), |_| Vec::new()));
    assert_eq!(u.unwind(1, &[], &jit, &sample, &|_| None), want);
    // Without them the walk ends at the first trampoline.
    assert_eq!(
        u.unwind(1, &[], &JitCode::EMPTY, &sample, &|_| None).addrs,
        vec![BASE + 6]
    );
}
