//! How processes, programs, objects and frames are found and named: a
//! command that execs into a chroot or another mount namespace, programs
//! named as the user gave them, stacks that reach their root.

use std::{collections::BTreeSet, path::Path, process::Command};

use serde_json::Value;

use crate::harness::{compile_c, scratch, sites::per_site, JsonTracer, Target};

/// ROOT/app/prog (`rooted.c`) with the files `ldd` lists for it copied
/// under ROOT: other files (inodes) than the host's, as in a container.
fn chroot_with_rooted(tag: &str) -> std::path::PathBuf {
    let bin = compile_c("rooted", tag, &["-O2", "-g"]);
    let root = scratch(&format!("chroot-{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("app")).expect("mkdir ROOT/app");
    std::fs::copy(&bin, root.join("app/prog")).expect("copy the program");
    let ldd = Command::new("ldd").arg(&bin).output().expect("run ldd");
    let listed = String::from_utf8_lossy(&ldd.stdout).into_owned();
    for lib in listed.split_whitespace().filter(|w| w.starts_with('/')) {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a library's directory")).expect("mkdir");
        std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
    root
}

/// The exact numbers of rooted.c's sites.
fn assert_rooted_exact(report: &Value) {
    let sites = per_site(report);
    assert_eq!(
        sites.get("site_churn"),
        Some(&[0, 0, 20_000 * 100, 20_000]),
        "{sites:?}"
    );
    assert_eq!(
        sites.get("site_kept"),
        Some(&[12345, 1, 12345, 1]),
        "{sites:?}"
    );
}

/// `chroot ROOT /app/prog` loads ROOT's libc, not the host's that was
/// hooked before the command started: it is hooked at the exec, before
/// the program runs.
#[test]
fn a_command_that_execs_in_a_chroot_is_traced_through_its_own_libc() {
    let root = chroot_with_rooted("chroot");
    let root = root.to_str().expect("UTF-8 scratch path");
    let tracer = JsonTracer::spawn("chroot", &["--", "chroot", root, "/app/prog"]);
    let (report, _) = tracer.finish();
    assert_rooted_exact(&report);
}

/// The same with --follow-forks through `unshare -m` (a mount namespace)
/// and a chroot.
#[test]
fn a_followed_command_in_another_mount_namespace_is_traced_through_its_own_libc() {
    let root = chroot_with_rooted("unshare");
    let root = root.to_str().expect("UTF-8 scratch path");
    assert!(Path::new(root).is_dir());
    let tracer = JsonTracer::spawn(
        "unshare",
        &[
            "--follow-forks",
            "--",
            "unshare",
            "-m",
            "chroot",
            root,
            "/app/prog",
        ],
    );
    let (report, _) = tracer.finish();
    assert_rooted_exact(&report);
}

/// `--binary LINK`, LINK a symbolic link to the program (as
/// /usr/bin/redis-server is to redis-check-rdb): the report names the
/// program as given, with the file it resolves to noted once, and so do
/// the frames of the program's own code.
#[test]
fn a_binary_given_through_a_symbolic_link_is_named_as_given() {
    let bin = compile_c("sites", "symlinked", &["-O2", "-g"]);
    let link = scratch("given-name");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&bin, &link).expect("symlink");
    let (link_s, bin_s) = (link.to_str().expect("UTF-8"), bin.to_str().expect("UTF-8"));
    let mut target = Target::start(&link, &[]);
    let tracer = JsonTracer::start("given-name", &["--binary", link_s]);
    target.run_sites();
    let (report, out) = tracer.stop();
    assert_eq!(report["target"], format!("binary {link_s} ({bin_s})"));
    assert!(
        out.stderr
            .contains(&format!("every process running {link_s} ({bin_s})")),
        "{}",
        out.stderr
    );
    let modules: BTreeSet<&str> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s["frames"].as_array().expect("frames"))
        .filter(|f| {
            f["function"]
                .as_str()
                .is_some_and(|n| n.starts_with("site_"))
        })
        .filter_map(|f| f["module"].as_str())
        .collect();
    assert_eq!(modules, BTreeSet::from([link_s]), "{report}");
}

/// A command that re-execs itself 100 times within milliseconds: each
/// image's block is counted, and stacks the tracer could not name (the
/// image was gone before its maps were read) are put down to that, not
/// to the stack window.
#[test]
fn quick_re_execs_are_counted_and_their_unnamed_frames_explained() {
    let bin = compile_c("reexec", "plain", &["-O2", "-g"]);
    let tracer = JsonTracer::spawn("reexec", &["--", bin.to_str().expect("UTF-8"), "100"]);
    let (report, _) = tracer.finish();
    let stacks = report["stacks"].as_array().expect("stacks");
    let sum = |key: &str| -> u64 { stacks.iter().map(|s| s[key].as_u64().expect("count")).sum() };
    assert_eq!((sum("alloc_objects"), sum("alloc_bytes")), (101, 101 * 777));
    // The same site in 101 images (other addresses in each) is not 101
    // stacks: stacks that name the same frames are one.
    let mut printed = BTreeSet::new();
    for s in stacks {
        let names: Vec<&str> = s["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f["function"].as_str().unwrap_or(""))
            .collect();
        assert!(printed.insert(names.clone()), "{names:?} twice: {stacks:?}");
    }
    let notes: Vec<&str> = report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !notes.iter().any(|n| n.contains("--stack-bytes")),
        "{notes:#?}"
    );
    let unnamed = stacks.iter().any(|s| {
        s["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .any(|f| f["function"] == "[unknown]")
    });
    assert!(
        !unnamed
            || notes
                .iter()
                .any(|n| n.contains("exited or called exec before")),
        "{notes:#?}"
    );
}

/// `--pid` of a program started through a symbolic link (LINK → the
/// file, as /usr/bin/redis-server → redis-check-rdb): its own frames are
/// shown under the link, the name the user started it by.
#[test]
fn a_process_started_through_a_symbolic_link_has_its_frames_under_the_link() {
    let bin = compile_c("sites", "symlinked-pid", &["-O2", "-g"]);
    let link = scratch("started-as");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&bin, &link).expect("symlink");
    let mut target = Target::start(&link, &[]);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start("started-as", &["--pid", &pid]);
    target.run_sites();
    let (report, _) = tracer.stop();
    let modules: BTreeSet<&str> = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .flat_map(|s| s["frames"].as_array().expect("frames"))
        .filter(|f| {
            f["function"]
                .as_str()
                .is_some_and(|n| n.starts_with("site_"))
        })
        .filter_map(|f| f["module"].as_str())
        .collect();
    let link_s = link.to_str().expect("UTF-8");
    assert_eq!(modules, BTreeSet::from([link_s]));
}

/// Forked children that never exec and exit at once (often gone before
/// the tracer reads their command line), folded into their program's
/// group (`--exited-processes 0`): the group is the parent's program, not
/// an unknown one.
#[test]
fn forked_children_that_exit_at_once_are_folded_under_their_parents_program() {
    let bin = compile_c("forker", "forks-folded", &["-O2", "-g"]);
    let mut target = Target::start(&bin, &["20", "exit"]);
    let pid = target.pid().to_string();
    let tracer = JsonTracer::start(
        "forks-folded",
        &["--pid", &pid, "--follow-forks", "--exited-processes", "0"],
    );
    target.send("go");
    target.wait_for("forked all");
    let (report, _) = tracer.stop();
    let groups: Vec<(&str, u64)> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["folded"].as_u64().is_some_and(|n| n > 0))
        .map(|p| {
            (
                p["program"].as_str().unwrap_or(""),
                p["folded"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let bin_s = bin.to_str().expect("UTF-8");
    assert_eq!(groups, [(bin_s, 20)], "{}", report["processes"]);
    let programs: BTreeSet<&str> = report["not_freed_at_exit"]["stacks"]
        .as_array()
        .expect("not freed at exit")
        .iter()
        .filter_map(|s| s["program"].as_str())
        .collect();
    assert_eq!(
        programs,
        BTreeSet::from([bin_s]),
        "{}",
        report["not_freed_at_exit"]
    );
}
