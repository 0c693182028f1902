//! The table compiler checked against binutils: every row `readelf
//! --debug-dump=frames-interp` prints must agree with the rule the table
//! gives at that address.

use std::{collections::HashMap, path::Path, process::Command};

use object::Object as _;

use crate::stacks::unwind_table::*;

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
