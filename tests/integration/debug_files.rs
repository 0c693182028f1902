//! Separate debug files inside a chroot: a stripped program
//! whose static functions are named only by its debug file, found by build
//! id or by `.gnu_debuglink` under the chroot's own root; and without any,
//! frames that keep module, build id and offset for later.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

use crate::harness::{compile_c, pprof::pprof, scratch, sites::per_site, JsonTracer};

/// Where the debug file of the chrooted program goes.
enum DebugAt {
    BuildId,
    /// ROOT/app/.debug/prog.debug, named by the program's debug link.
    Link,
    Nowhere,
}

fn run(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {cmd} (binutils: cargo xtask setup): {e}"));
    assert!(status.success(), "{cmd} {args:?} failed");
}

/// ROOT/app/prog: splitdebug.c built -O2 -g without frame pointers, split
/// (objcopy --only-keep-debug), stripped (--strip-all) and linked to its
/// debug file, which is put under ROOT as `at` says and nowhere else; the
/// libraries `ldd` lists copied under ROOT. Returns (ROOT, build id).
fn chroot_with_split_program(tag: &str, at: DebugAt) -> (PathBuf, String) {
    let full = compile_c("splitdebug", tag, &["-O2", "-g", "-fomit-frame-pointer"]);
    let root = scratch(&format!("debug-root-{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("app")).expect("mkdir ROOT/app");
    let s = |p: &PathBuf| p.to_str().expect("UTF-8 scratch path").to_string();
    let debug = scratch(&format!("splitdebug-{tag}.debug"));
    let prog = root.join("app/prog");
    run("objcopy", &["--only-keep-debug", &s(&full), &s(&debug)]);
    run("strip", &["--strip-all", "-o", &s(&prog), &s(&full)]);
    run(
        "objcopy",
        &[&format!("--add-gnu-debuglink={}", s(&debug)), &s(&prog)],
    );
    let id = build_id(&prog);
    let to = match at {
        DebugAt::BuildId => Some(root.join(format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &id[..2],
            &id[2..]
        ))),
        DebugAt::Link => Some(root.join(format!(
            "app/.debug/{}",
            debug.file_name().and_then(|n| n.to_str()).expect("name")
        ))),
        DebugAt::Nowhere => None,
    };
    if let Some(to) = to {
        std::fs::create_dir_all(to.parent().expect("a directory")).expect("mkdir");
        std::fs::rename(&debug, &to).expect("move the debug file into ROOT");
    } else {
        std::fs::remove_file(&debug).expect("remove the debug file");
    }
    let ldd = Command::new("ldd").arg(&full).output().expect("run ldd");
    let listed = String::from_utf8_lossy(&ldd.stdout).into_owned();
    for lib in listed.split_whitespace().filter(|w| w.starts_with('/')) {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a library's directory")).expect("mkdir");
        std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    (root, id)
}

/// The GNU build id `readelf -n` shows.
fn build_id(path: &std::path::Path) -> String {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {}: {text}", path.display()))
        .to_string()
}

fn trace_in_chroot(tag: &str, at: DebugAt) -> (Value, PathBuf, String) {
    let (root, id) = chroot_with_split_program(tag, at);
    let r = root.to_str().expect("UTF-8 scratch path");
    let tracer = JsonTracer::spawn(tag, &["--", "chroot", r, "/app/prog"]);
    let (report, _) = tracer.finish();
    (report, scratch(&format!("{tag}.json")), id)
}

/// The names of the stack whose leaf allocated `bytes` in total.
fn stack_of(report: &Value, alloc_bytes: u64) -> Vec<String> {
    let stack = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["alloc_bytes"] == alloc_bytes)
        .unwrap_or_else(|| panic!("no stack of {alloc_bytes} bytes: {report}"));
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("").to_string())
        .collect()
}

fn assert_static_functions_named(report: &Value) {
    let sites = per_site(report);
    assert_eq!(
        sites.get("static_site_kept"),
        Some(&[4321, 1, 4321, 1]),
        "{sites:?}"
    );
    assert_eq!(
        sites.get("static_site_churn"),
        Some(&[0, 0, 64 * 1000, 1000]),
        "{sites:?}"
    );
    let kept = stack_of(report, 4321);
    assert_eq!(
        kept[..3],
        ["static_site_kept", "static_caller", "main"],
        "{kept:?}"
    );
}

#[test]
fn a_stripped_program_in_a_chroot_is_named_by_its_debug_file_found_by_build_id() {
    let (report, _, id) = trace_in_chroot("debug-by-id", DebugAt::BuildId);
    assert_static_functions_named(&report);
    let kept = &report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["alloc_bytes"] == 4321)
        .expect("the kept block")["frames"][0];
    assert_eq!(kept["build_id"], id.as_str(), "{kept}");
    assert!(
        kept["line"].as_u64().is_some(),
        "lines from the debug file: {kept}"
    );
}

#[test]
fn a_stripped_program_in_a_chroot_is_named_by_its_debug_file_found_by_debug_link() {
    let (report, _, _) = trace_in_chroot("debug-by-link", DebugAt::Link);
    assert_static_functions_named(&report);
}

/// Nothing names the static functions: their frames keep module, build id
/// and file offset in JSON, and so does the pprof made from it (`report`),
/// whose mapping a symbolizer may pick up (no has_functions).
#[test]
fn without_a_debug_file_frames_keep_module_build_id_and_offset() {
    let (report, json, id) = trace_in_chroot("debug-none", DebugAt::Nowhere);
    let stack = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["alloc_bytes"] == 4321)
        .expect("the kept block");
    let leaf = &stack["frames"][0];
    assert_eq!(leaf["function"], "[unknown]", "{leaf}");
    assert!(
        leaf["module"]
            .as_str()
            .is_some_and(|m| m.ends_with("/app/prog")),
        "{leaf}"
    );
    assert_eq!(leaf["build_id"], id.as_str(), "{leaf}");
    // The offset is inside static_site_kept in the unstripped program.
    let full = compile_c(
        "splitdebug",
        "debug-none",
        &["-O2", "-g", "-fomit-frame-pointer"],
    );
    let (start, end) = function_offsets(&full, "static_site_kept");
    let offset = leaf["offset"].as_u64().expect("offset");
    assert!(
        (start..end).contains(&offset),
        "{offset:#x} not in {start:#x}..{end:#x}"
    );

    let pb = scratch("debug-none.pb.gz");
    let out = Command::new(env!("CARGO_BIN_EXE_memtrace-bpf"))
        .arg("report")
        .arg(&json)
        .args(["--format", "pprof", "-o"])
        .arg(&pb)
        .output()
        .expect("run memtrace-bpf report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let raw = pprof(&["-raw"], &pb);
    let mapping = raw
        .lines()
        .skip_while(|l| !l.starts_with("Mappings"))
        .find(|l| l.contains("/app/prog"))
        .unwrap_or_else(|| panic!("no mapping of the program: {raw}"));
    assert!(mapping.contains(&id), "{mapping}");
    assert!(!mapping.contains("[FN]"), "left to a symbolizer: {mapping}");
    // start/limit/offset: address - start + offset is the file offset.
    let fields: Vec<u64> = mapping
        .split_whitespace()
        .nth(1)
        .expect("start/limit/offset")
        .split('/')
        .map(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).expect("hex"))
        .collect();
    let [start_m, limit_m, file_offset] = fields[..] else {
        panic!("{mapping}")
    };
    let address = offset + start_m - file_offset;
    assert!(start_m <= address && address < limit_m, "{mapping}");
    assert!(
        raw.contains(&format!("{address:#x} M=")),
        "location at {address:#x}: {raw}"
    );
}

/// (file offset of the first byte, of the byte after) of function `name`
/// in `bin` (nm's address less its segment's vaddr - offset).
fn function_offsets(bin: &std::path::Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(bin).expect("read the program");
    let file = object::File::parse(&*data).expect("ELF");
    use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
    let sym = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} in the unstripped program"));
    let seg = file
        .segments()
        .find(|s| (s.address()..s.address() + s.size()).contains(&sym.address()))
        .expect("its segment");
    let start = sym.address() - seg.address() + seg.file_range().0;
    (start, start + sym.size())
}

/// DIR/app/prog: splitdebug.c built -O2 -g, stripped (--strip-all), with a
/// `.gnu_debuglink` section naming `link` (written by hand: objcopy
/// --add-gnu-debuglink keeps only a file name). Returns (DIR, the program).
fn program_linked_to(tag: &str, link: impl Fn(&std::path::Path) -> String) -> (PathBuf, PathBuf) {
    let full = compile_c("splitdebug", tag, &["-O2", "-g", "-fomit-frame-pointer"]);
    let dir = scratch(&format!("debug-link-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("app")).expect("mkdir DIR/app");
    let s = |p: &PathBuf| p.to_str().expect("UTF-8 scratch path").to_string();
    let prog = dir.join("app/prog");
    run("strip", &["--strip-all", "-o", &s(&prog), &s(&full)]);
    // The section: the name, NUL, padding to 4 bytes, a CRC32 (any).
    let mut section = link(&dir).into_bytes();
    section.push(0);
    section.resize(section.len().next_multiple_of(4), 0);
    section.extend_from_slice(&0x0bad_c0deu32.to_le_bytes());
    let data = dir.join("debuglink.section");
    std::fs::write(&data, &section).expect("write the section");
    run(
        "objcopy",
        &[
            &format!("--add-section=.gnu_debuglink={}", s(&data)),
            &s(&prog),
        ],
    );
    (dir, prog)
}

/// `../../../../../../../DIR/secret`: from DIR/app (or anywhere) it climbs
/// to / and comes down to DIR/secret.
fn climbing_to_secret(dir: &std::path::Path) -> String {
    let abs = dir.to_str().expect("UTF-8 scratch path");
    format!("{}{}/secret", "../".repeat(7), abs.trim_start_matches('/'))
}

/// Traces `prog` to its exit (bounded by the harness's timeout): the
/// report must be written.
fn trace_to_report(tag: &str, prog: &std::path::Path) -> Value {
    let tracer = JsonTracer::spawn(tag, &[std::ffi::OsStr::new("--"), prog.as_os_str()]);
    tracer.finish().0
}

/// The static functions stay [unknown] and a note names the refused link.
fn assert_link_refused(report: &Value, link: &str) {
    let kept = stack_of(report, 4321);
    assert_eq!(kept[0], "[unknown]", "{kept:?}");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("not followed") && notes.contains(link),
        "a note names the refused link: {notes}"
    );
}

/// A FIFO with no writer blocks whoever opens it for reading: the tracer,
/// running as root, must never open what a refused link names.
#[test]
fn a_debug_link_that_climbs_to_a_fifo_is_refused_and_the_report_written() {
    let (dir, prog) = program_linked_to("link-fifo", climbing_to_secret);
    let secret =
        std::ffi::CString::new(dir.join("secret").to_str().expect("UTF-8")).expect("no NUL");
    // SAFETY: `secret` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(secret.as_ptr(), 0o600) }, 0, "mkfifo");
    let report = trace_to_report("link-fifo", &prog);
    assert_link_refused(&report, &climbing_to_secret(&dir));
}

/// A regular file a refused link names is not opened: inotify sees no
/// open of it (IN_OPEN is reported for every open, by anyone).
#[test]
fn a_debug_link_that_climbs_to_a_file_outside_is_not_opened() {
    let (dir, prog) = program_linked_to("link-file", climbing_to_secret);
    let secret = dir.join("secret");
    std::fs::write(&secret, b"not for the tracer").expect("write the secret");
    // SAFETY: plain syscalls on our own descriptor; results are checked.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0, "inotify_init1");
    let path = std::ffi::CString::new(secret.to_str().expect("UTF-8")).expect("no NUL");
    // SAFETY: `fd` is ours and `path` a valid NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN | libc::IN_ACCESS) };
    assert!(wd >= 0, "inotify_add_watch");
    let report = trace_to_report("link-file", &prog);
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is writable for its length; `fd` is ours.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    assert!(
        n < 0 && err.kind() == std::io::ErrorKind::WouldBlock,
        "the secret was opened or read ({n} bytes of inotify events)"
    );
    assert_link_refused(&report, &climbing_to_secret(&dir));
}
