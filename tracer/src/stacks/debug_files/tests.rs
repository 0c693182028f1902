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
    assert!(bare.has_debuglink);
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
    assert!(found.debug_file.is_some(), "by build id");
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
