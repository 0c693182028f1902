//! The table's row encoding, bad input, and a table read from an open
//! file; readelf.rs checks the table compiler against binutils.

use std::path::Path;

use super::*;

mod readelf;

#[test]
fn rows_round_trip_through_the_encoding() {
    let cases = [
        Cfa::Sp(8),
        Cfa::Sp(0x0010_0018),
        Cfa::Sp((8 << 19) - 8),
        Cfa::Fp(16),
        Cfa::DerefSp(160),
        Cfa::DerefFp(-8),
        Cfa::Fp(-(8 << 19)),
        Cfa::Plt { threshold: 11 },
        Cfa::Signal,
        Cfa::Outermost,
        Cfa::NoInfo,
        Cfa::Unsupported(Unsupported::CfaRegister),
        Cfa::Unsupported(Unsupported::CfaExpression),
        Cfa::Unsupported(Unsupported::ReturnAddress),
        Cfa::Unsupported(Unsupported::Offset),
    ];
    for cfa in cases {
        for fp in [
            Fp::Same,
            Fp::AtCfa(-16),
            Fp::AtCfa(-256),
            Fp::AtCfa(248),
            Fp::Lost,
        ] {
            let rule = Rule { cfa, fp };
            assert_eq!(decode_rule(encode_rule(rule)), Some(rule), "{rule:?}");
        }
    }
    assert_eq!(words(8 << 19, CFA_OFF_BITS), None, "4 MiB does not fit");
    assert_eq!(words(12, CFA_OFF_BITS), None, "not a multiple of 8");
    assert_eq!(words(-264, FP_OFF_BITS), None);
}

#[test]
fn encoded_rows_sort_as_their_addresses() {
    let rule = |cfa| Rule { cfa, fp: Fp::Same };
    let rows = vec![
        Row {
            pc: 0x2000,
            rule: rule(Cfa::Unsupported(Unsupported::Offset)),
        },
        Row {
            pc: 0x1000,
            rule: rule(Cfa::Sp(8)),
        },
        Row {
            pc: 0x1000,
            rule: rule(Cfa::NoInfo),
        },
        Row {
            pc: 0x1004,
            rule: rule(Cfa::Sp(8)),
        },
        Row {
            pc: 0x1010,
            rule: rule(Cfa::NoInfo),
        },
    ];
    let table = UnwindTable::from_rows(rows, BuildStats::default());
    // The end marker at 0x1000 loses to the function starting there, and
    // the repeated rule at 0x1004 is merged away.
    assert_eq!(table.rows.len(), 3);
    let words = table.encoded().expect("fits");
    assert!(words.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(words[0] >> 32, 0);
    assert_eq!(words[2] >> 32, 0x1000);
    assert_eq!(table.lookup(0xfff), None);
    assert_eq!(table.lookup(0x100f).map(|r| r.cfa), Some(Cfa::Sp(8)));
    assert_eq!(table.lookup(0x1010).map(|r| r.cfa), Some(Cfa::NoInfo));
}

fn not_a_table(data: &[u8]) -> String {
    UnwindTable::from_elf(data)
        .map(|_| ())
        .expect_err("no table")
        .to_string()
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    assert!(not_a_table(b"").contains("not an ELF"));
    assert!(not_a_table(b"\x7fELF\x02\x01\x01garbage").contains("not an ELF"));
    let mut elf = std::fs::read("/proc/self/exe").expect("self");
    // Truncated mid-file: sections point past the end.
    elf.truncate(elf.len() / 3);
    let _ = UnwindTable::from_elf(&elf);
}

/// The numbers in docs/unwind-tables.md: rows, bytes and build time per
/// file. Not a timed test (it asserts nothing about time); run with
///
/// `MEMTRACE_UWT_FILES=/usr/bin/rg:... cargo test -p memtrace-bpf --lib
/// measure_unwind_tables -- --ignored --nocapture`
#[test]
#[ignore = "prints measurements for the design doc"]
fn measure_unwind_tables() {
    let files = std::env::var("MEMTRACE_UWT_FILES")
        .unwrap_or_else(|_| "/lib/x86_64-linux-gnu/libc.so.6:/usr/bin/python3.11".into());
    println!("file | size | FDEs | rows before merge | rows | bytes | distinct rules | unsupported [reg, expr, ra, off] | build ms");
    for path in files.split(':').filter(|p| !p.is_empty()) {
        let data = std::fs::read(path).expect("read");
        let started = std::time::Instant::now();
        let table = UnwindTable::from_elf(&data).expect("table");
        let words = table.encoded().expect("fits");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let rules: std::collections::HashSet<u32> = words.iter().map(|w| *w as u32).collect();
        let s = table.stats;
        println!(
            "{path} | {} KiB | {} | {} | {} | {} KiB | {} | {:?} | {ms:.1}",
            data.len() / 1024,
            s.fdes,
            s.raw_rows,
            table.rows.len(),
            words.len() * ROW_BYTES / 1024,
            rules.len(),
            s.unsupported,
        );
    }
}

/// Reading only the headers and the CFI sections of an open file gives
/// the table and the PT_LOAD list that the whole file's bytes give.
#[test]
fn a_table_read_from_the_open_file_is_the_one_built_from_its_bytes() {
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    for path in [
        Path::new("/lib/x86_64-linux-gnu/libc.so.6"),
        Path::new("/usr/bin/python3.11"),
        exe.as_path(),
    ] {
        let data = std::fs::read(path).expect("read");
        let whole = UnwindTable::from_elf(&data).expect("table from bytes");
        let file = std::fs::File::open(path).expect("open");
        let (loads, read) = UnwindTable::from_file(&file);
        let read = read.expect("table from the file");
        assert_eq!(read.base, whole.base, "{path:?}");
        assert_eq!(read.rows, whole.rows, "{path:?}");
        assert_eq!(read.stats, whole.stats, "{path:?}");
        let parsed = object::File::parse(&*data).expect("parse");
        assert_eq!(
            loads,
            crate::stacks::cfi::load_segments(&parsed),
            "{path:?}"
        );
    }
    // Not ELF, empty: an error and no segments, never a panic.
    let (loads, table) = UnwindTable::from_file(&std::fs::File::open("/dev/null").expect("null"));
    assert!(loads.is_empty());
    assert!(table
        .expect_err("no table")
        .to_string()
        .contains("not an ELF"));
}
