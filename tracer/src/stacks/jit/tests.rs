use std::{io::Write as _, os::unix::fs::symlink};

use super::{
    entries::{Entries, MAX_ENTRIES},
    jitdump::{DumpReader, Record},
    perf_map::{parse_line, LineReader, MAX_LINE, MAX_NAME},
    *,
};

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memtrace-jit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

fn lines_of(file: &File, reader: &mut LineReader) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut budget = u64::MAX;
    reader
        .read_new(file, &mut budget, |l| out.push(l.to_vec()))
        .expect("read");
    out
}

#[test]
fn perf_map_lines_hostile_and_not() {
    assert_eq!(
        parse_line(b"7fd44c006ec0 224 JS:^leak /tmp/a b.js:3:27"),
        Some((
            0x7fd4_4c00_6ec0,
            0x7fd4_4c00_70e4,
            "JS:^leak /tmp/a b.js:3:27".into()
        ))
    );
    assert_eq!(parse_line(b"0x10 0X20 f\r"), Some((0x10, 0x30, "f".into())));
    for bad in [
        &b"zz 10 f"[..],
        b"10 zz f",
        b"+10 10 f",
        b"10 0 empty",
        b"ffffffffffffffff 2 overflow",
        b"11111111111111111 1 seventeen digits",
        b"",
        b"10",
    ] {
        assert_eq!(parse_line(bad), None, "{:?}", String::from_utf8_lossy(bad));
    }
    let (_, _, name) = parse_line(b"10 1 bad\xff\xfename").expect("entry");
    assert_eq!(name, "bad\u{fffd}\u{fffd}name");
    let long = [b"10 1 ".to_vec(), "é".repeat(MAX_NAME).into_bytes()].concat();
    let (_, _, name) = parse_line(&long).expect("entry");
    assert!(name.len() <= MAX_NAME && name.chars().all(|c| c == 'é'));
}

#[test]
fn perf_map_is_read_as_it_grows_and_huge_lines_are_cut() {
    let dir = scratch("grow");
    let path = dir.join("perf-1.map");
    let mut w = File::create(&path).expect("create");
    let file = File::open(&path).expect("open");
    let mut reader = LineReader::default();
    w.write_all(b"10 10 first\n20 10 sec").expect("write");
    assert_eq!(lines_of(&file, &mut reader), [b"10 10 first".to_vec()]);
    w.write_all(b"ond\n").expect("write");
    assert_eq!(lines_of(&file, &mut reader), [b"20 10 second".to_vec()]);
    // 10 MiB without a newline, then a good line: the long one is cut,
    // the next one is read whole.
    let huge = vec![b'a'; 10 << 20];
    w.write_all(b"30 10 ").expect("write");
    w.write_all(&huge).expect("write");
    w.write_all(b"\n40 10 after\n").expect("write");
    let lines = lines_of(&file, &mut reader);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].len(), MAX_LINE);
    assert_eq!(lines[1], b"40 10 after");
    assert!(
        lines_of(&file, &mut reader).is_empty(),
        "nothing read twice"
    );
    // The budget bounds the bytes read.
    w.write_all(&huge).expect("write");
    let mut budget = 1000;
    reader.read_new(&file, &mut budget, |_| {}).expect("read");
    assert_eq!(budget, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_latest_entry_covering_an_address_wins() {
    let mut e = Entries::default();
    assert!(e.insert(0x100, 0x200, "old"));
    assert!(e.insert(0x140, 0x160, "inner"));
    assert_eq!(e.lookup(0x13f), Some((0x100, "old")));
    assert_eq!(e.lookup(0x150), Some((0x140, "inner")));
    assert_eq!(e.lookup(0x160), Some((0x160, "old")));
    assert_eq!(e.lookup(0x1ff), Some((0x160, "old")));
    assert_eq!(e.lookup(0x200), None);
    assert_eq!(e.lookup(0xff), None);
    // Covering several older entries at once.
    assert!(e.insert(0x80, 0x180, "wide"));
    assert_eq!(e.lookup(0x150), Some((0x80, "wide")));
    assert_eq!(e.lookup(0x180), Some((0x180, "old")));
    assert_eq!(e.len(), 2);
    assert!(!e.insert(0x10, 0x10, "empty"));
}

#[test]
fn entries_are_capped() {
    let mut e = Entries::default();
    let mut n = 0u64;
    while e.insert(n * 16, n * 16 + 8, "f") {
        n += 1;
    }
    assert!(e.len() <= MAX_ENTRIES && e.len() + 2 > MAX_ENTRIES);
}

/// A jitdump file: header, then records.
fn jitdump(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in [0x4A69_5444u32, 1, 40, 62, 0, 7] {
        out.extend(v.to_ne_bytes());
    }
    out.extend([0u8; 16]);
    for r in records {
        out.extend(r);
    }
    out
}

fn load(addr: u64, size: u64, name: &[u8]) -> Vec<u8> {
    let total = 16 + 40 + name.len() + 1 + size as usize;
    let mut r = Vec::new();
    r.extend(0u32.to_ne_bytes());
    r.extend((total as u32).to_ne_bytes());
    r.extend(0u64.to_ne_bytes());
    r.extend(7u32.to_ne_bytes());
    r.extend(7u32.to_ne_bytes());
    for v in [addr, addr, size, 1] {
        r.extend(v.to_ne_bytes());
    }
    r.extend(name);
    r.push(0);
    r.extend(vec![0xcc; size as usize]);
    r
}

fn moved(from: u64, to: u64, size: u64) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend(1u32.to_ne_bytes());
    r.extend(64u32.to_ne_bytes());
    r.extend(0u64.to_ne_bytes());
    r.extend([0u8; 8]);
    for v in [to, from, to, size, 1] {
        r.extend(v.to_ne_bytes());
    }
    r
}

#[test]
fn jitdump_loads_and_moves_are_read_as_the_file_grows() {
    let dir = scratch("dump");
    let path = dir.join("jit-7.dump");
    let whole = jitdump(&[load(0x1000, 0x40, b"first"), moved(0x1000, 0x2000, 0x40)]);
    let cut = whole.len() - 10;
    std::fs::write(&path, &whole[..cut]).expect("write");
    let file = File::open(&path).expect("open");
    let mut reader = DumpReader::default();
    let mut got = Vec::new();
    let mut budget = u64::MAX;
    reader
        .read_new(&file, &mut budget, |r| got.push(r))
        .expect("read");
    assert_eq!(
        got,
        [Record::Load {
            start: 0x1000,
            size: 0x40,
            name: "first".into()
        }]
    );
    let mut w = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("append");
    w.write_all(&whole[cut..]).expect("write");
    got.clear();
    reader
        .read_new(&file, &mut budget, |r| got.push(r))
        .expect("read");
    assert_eq!(
        got,
        [Record::Move {
            from: 0x1000,
            to: 0x2000,
            size: 0x40
        }]
    );
    // A record claiming less than its header: the file is dropped.
    let mut bad = jitdump(&[]);
    bad.extend(0u32.to_ne_bytes());
    bad.extend(4u32.to_ne_bytes());
    bad.extend(0u64.to_ne_bytes());
    std::fs::write(&path, &bad).expect("write");
    let mut reader = DumpReader::default();
    let file = File::open(&path).expect("open");
    reader.read_new(&file, &mut budget, |_| {}).expect("read");
    assert!(reader.dead);
    // Not a jitdump at all.
    std::fs::write(&path, vec![0x41u8; 100]).expect("write");
    let mut reader = DumpReader::default();
    reader.read_new(&file, &mut budget, |_| {}).expect("read");
    assert!(reader.dead);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn jitdump_files_are_told_by_name() {
    assert!(is_jitdump("/tmp/jit-1234.dump"));
    assert!(is_jitdump("jit-1.dump"));
    assert!(!is_jitdump("/tmp/jit-.dump"));
    assert!(!is_jitdump("/tmp/jit-12a.dump"));
    assert!(!is_jitdump("/tmp/perf-12.map"));
}

/// Our own process stands for the traced one: its root is /, its uid ours.
#[test]
fn a_symlinked_or_foreign_perf_map_is_refused() {
    let me = std::process::id();
    let uid = ProcessIds::read(me).expect("status").uid;
    let dir = scratch("links");
    let good = dir.join("perf-good.map");
    std::fs::write(&good, "10 10 f\n").expect("write");
    let link = dir.join("perf-link.map");
    symlink("/etc/shadow", &link).expect("symlink");
    let to_good = dir.join("perf-to-good.map");
    symlink(&good, &to_good).expect("symlink");
    let fifo = dir.join("perf-fifo.map");
    let c = CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let foreign = dir.join("perf-foreign.map");
    std::fs::write(&foreign, "10 10 f\n").expect("write");
    std::os::unix::fs::chown(&foreign, Some(uid + 1), None).expect("chown (tests run as root)");
    let open = |p: &std::path::Path| open_in_root(me, p.to_str().expect("utf-8"), uid);
    assert!(matches!(open(&good), Opened::File(_)));
    assert!(
        matches!(open(&link), Opened::Refused),
        "symlink to /etc/shadow"
    );
    assert!(matches!(open(&to_good), Opened::Refused), "any symlink");
    assert!(matches!(open(&fifo), Opened::Refused), "not a regular file");
    assert!(matches!(open(&foreign), Opened::Refused), "another user's");
    assert!(matches!(open(&dir.join("none.map")), Opened::Absent));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn jit_names_are_interned_once_and_told_from_objects() {
    let mut names = JitNames::default();
    let a = names.intern("JS:~a").expect("id");
    assert_eq!(names.intern("JS:~a"), Some(a));
    let b = names.intern("JS:~b").expect("id");
    assert_ne!(a, b);
    assert_eq!(names.get(a), Some("JS:~a"));
    assert_eq!(names.get(3), None, "an object index");
}
