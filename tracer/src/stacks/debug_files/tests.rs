use std::process::Command;

use super::*;

/// A C program with a static function, built -O2 -g into `dir`; returns
/// (full, stripped with a debug link to "p.debug", the debug file).
fn split_program(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let src = dir.join("p.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\nvoid *volatile k;\n\
         __attribute__((noipa)) static void hidden(int n) { k = malloc(n); }\n\
         int main(int c, char **v) { hidden(c); (void)v; return 0; }\n",
    )
    .expect("write");
    let (full, stripped, debug) = (dir.join("p.full"), dir.join("p"), dir.join("p.debug"));
    let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
        let ok = Command::new(cmd).args(args).status().expect(cmd);
        assert!(ok.success(), "{cmd} {args:?}");
    };
    run(
        "cc",
        &[
            "-O2".as_ref(),
            "-g".as_ref(),
            "-o".as_ref(),
            full.as_os_str(),
            src.as_os_str(),
        ],
    );
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            full.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run(
        "strip",
        &[
            "--strip-all".as_ref(),
            "-o".as_ref(),
            stripped.as_os_str(),
            full.as_os_str(),
        ],
    );
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run("objcopy", &[link.as_ref(), stripped.as_os_str()]);
    (full, stripped, debug)
}

fn open(p: &Path) -> File {
    File::open(p).expect("open")
}

#[test]
fn a_debug_file_is_found_by_build_id_inside_the_root_and_by_link_beside_the_object() {
    let dir = std::env::temp_dir().join(format!("memtrace-debugfiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (_, stripped, debug) = split_program(&dir.join("build"));
    let root_dir = dir.join("root");
    std::fs::create_dir_all(root_dir.join("app")).expect("mkdir");
    let root = File::open(&root_dir).expect("root");

    let bare = DebugInfo::read(&open(&stripped), Some(&root), "/app/p");
    let id = bare.build_id.clone().expect("cc writes a build id");
    assert!(!bare.own_dwarf, "blazesym must not follow the link");
    assert!(bare.refused_link.is_none());
    assert!(bare.debug_file.is_none(), "nothing in the root yet");

    // By build id, under the root's /usr/lib/debug.
    let by_id = root_dir.join(format!(
        "usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    std::fs::create_dir_all(by_id.parent().expect("dir")).expect("mkdir");
    std::fs::copy(&debug, &by_id).expect("copy");
    let found = DebugInfo::read(&open(&stripped), Some(&root), "/app/p");
    let file = found.debug_file.as_ref().expect("by build id");
    assert!(file.dwarf, "no link of its own: blazesym reads its DWARF");
    std::fs::remove_file(&by_id).expect("rm");

    // By link, in the object's .debug/ directory; with another CRC, not.
    let by_link = root_dir.join("app/.debug/p.debug");
    std::fs::create_dir_all(by_link.parent().expect("dir")).expect("mkdir");
    std::fs::copy(&debug, &by_link).expect("copy");
    let found = DebugInfo::read(&open(&stripped), Some(&root), "/app/p");
    assert!(found.debug_file.is_some(), "by link");
    let mut changed = std::fs::read(&debug).expect("read");
    changed.extend_from_slice(b"x");
    std::fs::write(&by_link, &changed).expect("write");
    let refused = DebugInfo::read(&open(&stripped), Some(&root), "/app/p");
    assert!(refused.debug_file.is_none(), "the CRC does not match");

    // A debug file of another program at the build id path is refused.
    let (_, other, other_debug) = split_program(&dir.join("other"));
    let _ = other;
    std::fs::create_dir_all(by_id.parent().expect("dir")).expect("mkdir");
    std::fs::remove_file(&by_link).expect("rm");
    std::fs::copy(&other_debug, &by_id).expect("copy");
    let refused = DebugInfo::read(&open(&stripped), Some(&root), "/app/p");
    assert!(refused.debug_file.is_none(), "another build id");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn links_that_name_paths_are_not_followed() {
    assert_eq!(link_name(b"p.debug").as_deref(), Some("p.debug"));
    assert_eq!(link_name(b"../p.debug"), None);
    assert_eq!(link_name(b"/etc/shadow"), None);
    assert_eq!(link_name(b".."), None);
    assert_eq!(link_name(b""), None);
    assert_eq!(link_name(&[b'a'; 300]), None);
}

/// `stripped` with its `.gnu_debuglink` section's name replaced by
/// `name` (same CRC), written to `to`.
fn relinked(stripped: &Path, name: &[u8], to: &Path) {
    let mut section = name.to_vec();
    section.push(0);
    section.resize(section.len().next_multiple_of(4), 0);
    section.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    let data = to.with_extension("section");
    std::fs::write(&data, &section).expect("write section");
    let ok = Command::new("objcopy")
        .arg("--remove-section=.gnu_debuglink")
        .arg(format!("--add-section=.gnu_debuglink={}", data.display()))
        .arg(stripped)
        .arg(to)
        .status()
        .expect("objcopy");
    assert!(ok.success());
}

#[test]
fn a_link_that_names_a_path_is_refused_and_nothing_follows_it() {
    let dir = std::env::temp_dir().join(format!("memtrace-badlink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (_, stripped, debug) = split_program(&dir.join("build"));
    let root_dir = dir.join("root");
    std::fs::create_dir_all(root_dir.join("app/.debug")).expect("mkdir");
    let root = File::open(&root_dir).expect("root");
    // The debug file sits where `../p.debug` would lead from .debug/:
    // refused all the same, and the object's DWARF is not read either.
    std::fs::copy(&debug, root_dir.join("app/p.debug")).expect("copy");
    let bad = dir.join("bad");
    relinked(&stripped, b"../p.debug", &bad);
    let info = DebugInfo::read(&open(&bad), Some(&root), "/app/p");
    assert!(info.debug_file.is_none());
    assert_eq!(info.refused_link.as_deref(), Some("../p.debug"));
    assert!(!info.own_dwarf, "blazesym must not follow a refused link");
    // A name that is not text is kept escaped for the report.
    relinked(&stripped, b"\x1b[2J\xff", &bad);
    let info = DebugInfo::read(&open(&bad), Some(&root), "/app/p");
    assert_eq!(info.refused_link.as_deref(), Some("\\x1b[2J\\xff"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_program_without_links_lets_blazesym_read_its_dwarf() {
    let dir = std::env::temp_dir().join(format!("memtrace-nolink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (full, _, _) = split_program(&dir.join("build"));
    let info = DebugInfo::read(&open(&full), None, "/p.full");
    assert!(info.own_dwarf);
    assert!(info.refused_link.is_none() && info.debug_file.is_none());
    // Unreadable: nothing is known, so blazesym reads no DWARF.
    assert!(!DebugInfo::read(&open(Path::new("/dev/null")), None, "/x").own_dwarf);
    let _ = std::fs::remove_dir_all(&dir);
}
