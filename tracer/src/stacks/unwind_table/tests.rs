//! The table compiler checked against binutils: every row `readelf
//! --debug-dump=frames-interp` prints must agree with the rule the table
//! gives at that address.

use std::{collections::HashMap, path::Path, process::Command};

use object::Object as _;

use super::*;

/// One row as readelf prints it: address, CFA, RBP and RA columns.
#[derive(Clone, Debug)]
struct ReadelfRow {
    pc: u64,
    cfa: String,
    rbp: String,
    ra: String,
}

#[derive(Debug)]
struct ReadelfFde {
    debug_frame: bool,
    start: u64,
    end: u64,
    signal: bool,
    rows: Vec<ReadelfRow>,
}

/// Parses `readelf --debug-dump=frames-interp` of `path`. An FDE without
/// instructions prints no rows: its CIE's initial row applies.
fn readelf_fdes(path: &Path) -> Vec<ReadelfFde> {
    // -wN: not the separate debug file a debuglink names (libc6-dbg), whose
    // .eh_frame is NOBITS and makes readelf fail.
    let out = Command::new("readelf")
        .args(["-wN", "--debug-dump=frames-interp"])
        .arg(path)
        .output()
        .expect("readelf (binutils) is installed");
    assert!(out.status.success(), "readelf failed on {}", path.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fdes: Vec<ReadelfFde> = Vec::new();
    let mut cies: HashMap<String, (bool, Option<ReadelfRow>)> = HashMap::new();
    let mut debug_frame = false;
    let mut columns: Vec<String> = Vec::new();
    // Where the rows being read go: a CIE (by offset) or the last FDE.
    let mut in_cie: Option<String> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 3 || words[1] == "ZERO" {
            columns.clear(); // a block ends
        } else if line.starts_with("Contents of the ") {
            debug_frame = line.contains(".debug_frame");
        } else if words.get(3) == Some(&"CIE") {
            let signal = words.get(4).is_some_and(|a| a.contains('S'));
            cies.insert(words[0].to_string(), (signal, None));
            in_cie = Some(words[0].to_string());
        } else if words.get(3) == Some(&"FDE") {
            let cie = words[4].trim_start_matches("cie=");
            let (start, end) = words[5]
                .trim_start_matches("pc=")
                .split_once("..")
                .expect("pc=a..b");
            let (signal, initial) = cies.get(cie).cloned().unwrap_or((false, None));
            let start = u64::from_str_radix(start, 16).expect("hex");
            let rows = initial
                .map(|r| ReadelfRow { pc: start, ..r })
                .into_iter()
                .collect();
            fdes.push(ReadelfFde {
                debug_frame,
                start,
                end: u64::from_str_radix(end, 16).expect("hex"),
                signal,
                rows,
            });
            in_cie = None;
        } else if words.first() == Some(&"LOC") {
            columns = words.iter().map(|w| w.to_string()).collect();
        } else if words.len() == columns.len() && words.len() >= 2 {
            let Ok(pc) = u64::from_str_radix(words[0], 16) else {
                continue;
            };
            let col = |name: &str| {
                let i = columns.iter().position(|c| c == name);
                i.map_or("u", |i| words[i]).to_string()
            };
            let row = ReadelfRow {
                pc,
                cfa: words[1].to_string(),
                rbp: col("rbp"),
                ra: col("ra"),
            };
            match &in_cie {
                Some(cie) => {
                    if let Some(c) = cies.get_mut(cie) {
                        c.1 = Some(row);
                    }
                }
                None => {
                    if let Some(fde) = fdes.last_mut() {
                        if fde.rows.first().is_some_and(|r| r.pc == pc) {
                            fde.rows.clear();
                        }
                        fde.rows.push(row);
                    }
                }
            }
        }
    }
    fdes
}

/// Whether our rule says what readelf's row says.
fn agrees(rule: Rule, row: &ReadelfRow, signal: bool) -> bool {
    if signal {
        return rule.cfa == Cfa::Signal;
    }
    let ra_ok = row.ra == "c-8";
    let cfa_ok = match rule.cfa {
        Cfa::Outermost => return row.ra == "u",
        Cfa::Unsupported(Unsupported::ReturnAddress) => return !ra_ok,
        Cfa::Sp(o) => row.cfa == format!("rsp+{o}"),
        Cfa::Fp(o) => row.cfa == format!("rbp+{o}"),
        Cfa::DerefSp(_) | Cfa::DerefFp(_) | Cfa::Plt { .. } => row.cfa == "exp",
        Cfa::Unsupported(Unsupported::CfaExpression) => row.cfa == "exp",
        Cfa::Unsupported(Unsupported::CfaRegister) => {
            !row.cfa.starts_with("rsp+") && !row.cfa.starts_with("rbp+") && row.cfa != "exp"
        }
        Cfa::Unsupported(Unsupported::Offset) => row.cfa.starts_with('r'),
        Cfa::Signal | Cfa::NoInfo => false,
    };
    let fp_ok = match rule.fp {
        Fp::Same => row.rbp == "u" || row.rbp == "s",
        Fp::AtCfa(o) => row.rbp == format!("c{o:+}"),
        Fp::Lost => !row.rbp.starts_with('c') && row.rbp != "u" && row.rbp != "s",
    };
    ra_ok && cfa_ok && fp_ok
}

/// Builds the table of `path` and checks it against readelf: every row
/// readelf prints, and the end of every function that no other starts at.
fn check_against_readelf(path: &Path) -> UnwindTable {
    let data = std::fs::read(path).expect("read ELF");
    let table = UnwindTable::from_elf(&data).expect("table");
    let fdes = readelf_fdes(path);
    assert!(
        !fdes.is_empty(),
        "readelf printed no FDE for {}",
        path.display()
    );
    let eh: Vec<(u64, u64)> = fdes
        .iter()
        .filter(|f| !f.debug_frame)
        .map(|f| (f.start, f.end))
        .collect();
    let starts: std::collections::HashSet<u64> = fdes.iter().map(|f| f.start).collect();
    let mut wrong = Vec::new();
    for fde in fdes.iter().filter(|f| f.start < f.end) {
        if fde.debug_frame && eh.iter().any(|&(s, e)| s < fde.end && fde.start < e) {
            continue; // .eh_frame describes this function; its rows win
        }
        for row in &fde.rows {
            let Some(rule) = table.lookup(row.pc) else {
                panic!(
                    "no row at {row:?} in {fde:?}, first row {:?}",
                    table.rows.first()
                );
            };
            if !agrees(rule, row, fde.signal) {
                wrong.push(format!("{row:?} -> {rule:?}"));
            }
        }
        if !starts.contains(&fde.end) {
            assert_eq!(table.lookup(fde.end).map(|r| r.cfa), Some(Cfa::NoInfo));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}: {} rows disagree with readelf, first: {:#?}",
        path.display(),
        wrong.len(),
        &wrong[..wrong.len().min(10)]
    );
    table
}

/// Compiles `source` with `flags` into a fresh directory; returns the binary.
fn compile(name: &str, source: &str, flags: &[&str]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memtrace-uwt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write source");
    let bin = dir.join(name);
    let ok = Command::new("cc")
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc (cargo xtask setup installs it)");
    assert!(ok.success(), "cc {flags:?} {name}.c failed");
    bin
}

/// A recursive function, a function with a 1 MiB array and a call through
/// the PLT (malloc), each kept from being inlined or elided.
const PROGRAM: &str = "#include <stdlib.h>\n#include <string.h>\n\
    void *volatile keep;\n\
    __attribute__((noinline)) int big(int n) {\n\
      char buf[1 << 20]; memset(buf, n, sizeof buf); keep = buf; keep = malloc(n);\n\
      return buf[n] + buf[7];\n}\n\
    __attribute__((noinline)) int rec(int n) {\n\
      if (n == 0) return big(3);\n\
      char a[40]; memset(a, n, 40); keep = a; return rec(n - 1) + a[3];\n}\n\
    int main(int c, char **v) { (void)v; return rec(c + 5); }\n";

fn symbol(path: &Path, name: &str) -> (u64, u64) {
    use object::ObjectSymbol as _;
    let data = std::fs::read(path).expect("read");
    let file = object::File::parse(&*data).expect("ELF");
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .expect("symbol");
    (sym.address(), sym.address() + sym.size())
}

/// The rules seen inside one function.
fn rules_in(table: &UnwindTable, (start, end): (u64, u64)) -> Vec<Rule> {
    (start..end).filter_map(|pc| table.lookup(pc)).collect()
}

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

#[test]
fn without_frame_pointers_rows_match_readelf() {
    let bin = compile("nofp", PROGRAM, &["-O2", "-fomit-frame-pointer"]);
    let table = check_against_readelf(&bin);
    let big = rules_in(&table, symbol(&bin, "big"));
    assert!(
        big.iter()
            .any(|r| matches!(r.cfa, Cfa::Sp(o) if o > 1 << 20)),
        "the 1 MiB frame is an RSP offset: {big:?}"
    );
    let rec = rules_in(&table, symbol(&bin, "rec"));
    assert!(rec.iter().all(|r| matches!(r.cfa, Cfa::Sp(_))), "{rec:?}");
    assert!(
        table
            .rows
            .iter()
            .any(|r| r.rule.cfa == Cfa::Plt { threshold: 11 }),
        "ld's .plt expression"
    );
    assert!(
        table.rows.iter().any(|r| r.rule.cfa == Cfa::Outermost),
        "_start"
    );
    let _ = std::fs::remove_dir_all(bin.parent().expect("dir"));
}

#[test]
fn with_frame_pointers_rows_match_readelf() {
    let bin = compile("fp", PROGRAM, &["-O2", "-fno-omit-frame-pointer"]);
    let table = check_against_readelf(&bin);
    for name in ["big", "rec"] {
        let rules = rules_in(&table, symbol(&bin, name));
        let body = Rule {
            cfa: Cfa::Fp(16),
            fp: Fp::AtCfa(-16),
        };
        assert!(rules.contains(&body), "{name}: {rules:?}");
    }
    let _ = std::fs::remove_dir_all(bin.parent().expect("dir"));
}

#[test]
fn debug_frame_fills_in_what_eh_frame_lacks() {
    let flags = [
        "-O1",
        "-g",
        "-fno-asynchronous-unwind-tables",
        "-fno-unwind-tables",
    ];
    let bin = compile("dbg", PROGRAM, &flags);
    let table = check_against_readelf(&bin);
    assert!(table.stats.debug_frame_fdes > 0, "{:?}", table.stats);
    let rec = rules_in(&table, symbol(&bin, "rec"));
    assert!(rec.iter().all(|r| matches!(r.cfa, Cfa::Sp(_))), "{rec:?}");
    let _ = std::fs::remove_dir_all(bin.parent().expect("dir"));
}

/// Debian's libc: thousands of functions, hand-written assembly, and the
/// signal trampoline `__restore_rt`.
#[test]
fn libc_rows_match_readelf() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let table = check_against_readelf(libc);
    assert!(table.rows.iter().any(|r| r.rule.cfa == Cfa::Signal));
    assert!(table.encoded().is_ok());
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
