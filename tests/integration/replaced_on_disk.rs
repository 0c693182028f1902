//! Objects replaced or deleted on disk while a process maps them (a
//! package upgrade): the mapped file is still the one hooked and named,
//! through /proc/PID/map_files.

use std::{
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
};

use crate::{
    allocators::{assert_hooked_instead_of_glibc, assert_sites_exact, JEMALLOC},
    harness::{
        compile_c, scratch,
        sites::{trace_sites_to_json, O2_FLAGS},
        JsonTracer, Target,
    },
};

/// A fresh directory `scratch/tag` holding a copy of Debian's jemalloc.
fn jemalloc_copy(tag: &str) -> PathBuf {
    let dir = scratch(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let lib = dir.join("libjemalloc.so.2");
    std::fs::copy(JEMALLOC, &lib).expect("copy jemalloc (cargo xtask setup installs it)");
    lib
}

/// What a package upgrade does: a new file renamed over the old one, which
/// the running process keeps mapping as "(deleted)".
fn replace_on_disk(path: &Path) {
    let new = path.with_extension("new");
    std::fs::copy(path, &new).expect("copy");
    std::fs::rename(&new, path).expect("rename over");
}

fn assert_maps_deleted(pid: u32, path: &Path) {
    let maps = std::fs::read(format!("/proc/{pid}/maps")).expect("maps");
    let mut wanted = path.as_os_str().as_bytes().to_vec();
    wanted.extend_from_slice(b" (deleted)");
    assert!(
        maps.windows(wanted.len()).any(|w| w == wanted),
        "the target should map the replaced file as deleted:\n{}",
        String::from_utf8_lossy(&maps)
    );
}

/// sites.c using a jemalloc whose file was replaced on disk after it
/// started: the mapped (deleted) object is still the one hooked, through
/// /proc/PID/map_files, with exact numbers. `linked`: a DT_NEEDED found
/// through LD_LIBRARY_PATH; otherwise LD_PRELOAD by path.
fn assert_replaced_jemalloc_exact(tag: &str, linked: bool) {
    let lib = jemalloc_copy(tag);
    let dir = lib.parent().expect("dir").to_str().expect("utf-8 path");
    let (bin, env) = if linked {
        let mut flags = O2_FLAGS.to_vec();
        flags.extend(["-Wl,--no-as-needed", JEMALLOC]);
        (compile_c("sites", tag, &flags), ("LD_LIBRARY_PATH", dir))
    } else {
        let path = lib.to_str().expect("utf-8 path");
        (compile_c("sites", tag, O2_FLAGS), ("LD_PRELOAD", path))
    };
    let mut target = Target::start_with_env(&bin, &[], &[env]);
    replace_on_disk(&lib);
    assert_maps_deleted(target.pid(), &lib);
    let report = trace_sites_to_json(&mut target, tag, true, libc::SIGINT);
    assert_hooked_instead_of_glibc(&report, lib.to_str().expect("utf-8 path"), "jemalloc");
    assert_sites_exact(&report);
}

#[test]
fn a_needed_jemalloc_replaced_on_disk_is_still_hooked_with_exact_numbers() {
    assert_replaced_jemalloc_exact("jemalloc-replaced-needed", true);
}

#[test]
fn a_preloaded_jemalloc_replaced_on_disk_is_still_hooked_with_exact_numbers() {
    assert_replaced_jemalloc_exact("jemalloc-replaced-preload", false);
}

/// An executable deleted after it started: traced, and its frames (the
/// site_* functions) are named from the mapped file.
#[test]
fn a_deleted_executable_is_traced_with_its_frames_named() {
    let built = compile_c("sites", "deleted-exe", O2_FLAGS);
    let dir = scratch("deleted-exe");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let bin = dir.join("sites");
    std::fs::copy(&built, &bin).expect("copy target");
    let mut target = Target::start(&bin, &[]);
    std::fs::remove_file(&bin).expect("delete the running executable");
    assert_maps_deleted(target.pid(), &bin);
    let report = trace_sites_to_json(&mut target, "deleted-exe", true, libc::SIGINT);
    crate::harness::sites::assert_sites_exact(&report);
    // DWARF unwinding reads the deleted file too: stacks reach main.
    crate::harness::sites::assert_site_stacks_complete(&report);
}

/// `--binary` of a program replaced on disk (a package upgrade) while a
/// process still runs the old file: that process is found and traced.
#[test]
fn binary_finds_a_process_whose_program_was_replaced_on_disk() {
    let built = compile_c("sites", "replaced-exe", O2_FLAGS);
    let dir = scratch("replaced-exe");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let bin = dir.join("sites");
    std::fs::copy(&built, &bin).expect("copy target");
    let mut target = Target::start(&bin, &[]);
    let fresh = dir.join("sites.new");
    std::fs::copy(&built, &fresh).expect("copy target");
    std::fs::rename(&fresh, &bin).expect("replace the running executable");
    assert_maps_deleted(target.pid(), &bin);
    let tracer = JsonTracer::start(
        "replaced-exe",
        &["--binary", bin.to_str().expect("utf-8 path")],
    );
    target.run_sites();
    let (report, _) = tracer.stop();
    assert_eq!(
        report["processes"][0]["pid"],
        target.pid(),
        "{}",
        report["processes"]
    );
    crate::harness::sites::assert_sites_exact(&report);
}
