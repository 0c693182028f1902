//! What a server sends is bounded in size and kept only if it is the
//! debug file of the build id asked for.

use std::path::{Path, PathBuf};

use object::Object as _;

use super::cache::{keep, write_bounded};
use crate::stacks::debug_files::{self, hex, NotTheDebugFile};

fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("memtrace-debuginfod-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

/// A program built with -g (DWARF, a build id, no debug link), its bytes
/// and its build id in hex.
fn program_with_dwarf(dir: &Path) -> (Vec<u8>, String) {
    let src = dir.join("p.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").expect("write");
    let bin = dir.join("p");
    let ok = std::process::Command::new("cc")
        .args(["-g", "-Wl,--build-id", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc (cargo xtask setup installs it)");
    assert!(ok.success());
    let data = std::fs::read(&bin).expect("read");
    let id = object::File::parse(&*data)
        .expect("ELF")
        .build_id()
        .expect("notes")
        .map(hex)
        .expect("a build id");
    (data, id)
}

/// Nothing but what `keep` was asked to keep is left in `dir`.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_download_past_the_size_bound_is_refused() {
    let dir = scratch("bound");
    let at = dir.join("f");
    let e = write_bounded(&at, &[7u8; 11][..], 10).expect_err("11 bytes past a bound of 10");
    assert!(e.to_string().contains("larger than 10 bytes"), "{e}");
    let _ = std::fs::remove_file(&at);
    write_bounded(&at, &[7u8; 10][..], 10).expect("10 bytes");
    assert_eq!(std::fs::metadata(&at).expect("stat").len(), 10);
    // Never over a file that is there (nor through a symbolic link).
    assert!(write_bounded(&at, &[1u8][..], 10).is_err());
    let (data, id) = program_with_dwarf(&dir);
    let entry = dir.join(&id);
    let why = keep(&entry, &entry.join("debuginfo"), &data[..], &id, 4096)
        .err()
        .expect("a debug file larger than the bound");
    assert!(why.contains("larger than 4096 bytes"), "{why}");
    assert!(entries(&entry).is_empty(), "{:?}", entries(&entry));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_download_is_kept_only_if_it_is_the_debug_file_of_the_build_id_asked_for() {
    let dir = scratch("id");
    let (data, id) = program_with_dwarf(&dir);
    let other = format!("{}00", &id[..id.len() - 2]);
    let entry = dir.join(&other);
    let max = debug_files::MAX_DEBUG_FILE_BYTES;
    let why = keep(&entry, &entry.join("debuginfo"), &data[..], &other, max)
        .err()
        .expect("another build id");
    assert!(why.contains(&format!("its build id is {id}")), "{why}");
    assert!(
        entries(&entry).is_empty(),
        "nothing kept: {:?}",
        entries(&entry)
    );
    let why = keep(
        &entry,
        &entry.join("debuginfo"),
        &b"not ELF"[..],
        &other,
        max,
    )
    .err()
    .expect("not ELF");
    assert_eq!(why, NotTheDebugFile::Unreadable.to_string());

    let entry = dir.join(&id);
    let found = keep(&entry, &entry.join("debuginfo"), &data[..], &id, max).expect("kept");
    assert!(found.dwarf, "its DWARF is read");
    assert_eq!(entries(&entry), ["debuginfo"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stripped_file_is_not_a_debug_file() {
    let dir = scratch("kinds");
    let (data, id) = program_with_dwarf(&dir);
    let stripped = dir.join("stripped");
    std::fs::write(&stripped, &data).expect("write");
    let ok = std::process::Command::new("strip")
        .args(["--strip-all"])
        .arg(&stripped)
        .status()
        .expect("strip (binutils)");
    assert!(ok.success());
    let open = |p: &Path| std::fs::File::open(p).expect("open");
    assert_eq!(
        debug_files::fetched(open(&stripped), &id).err(),
        Some(NotTheDebugFile::NoSymbols)
    );
    assert!(debug_files::fetched(open(&dir.join("p")), &id).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}
