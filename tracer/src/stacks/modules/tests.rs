//! Objects shared by file identity, kept while frames refer to them.

use super::*;

/// A pid that no process has (above the kernel's pid_max limit):
/// files are then opened by their path.
const NO_SUCH_PID: u32 = 1 << 23;

/// This test process's own executable mapping, moved to `shift`.
fn exe_mapping(shift: u64) -> Mapping {
    let text = std::fs::read("/proc/self/maps").expect("own maps");
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    let mut m = crate::tracee::process::parse_maps(&text)
        .into_iter()
        .find(|m| m.executable && std::path::Path::new(&m.path) == exe)
        .expect("an executable mapping of the test binary");
    m.start += shift;
    m.end += shift;
    m
}

#[test]
fn processes_mapping_one_file_share_one_object_kept_while_frames_refer_to_it() {
    let mut modules = Modules::default();
    let me = std::process::id();
    let a = exe_mapping(0);
    let b = exe_mapping(0x1000_0000);
    modules.set_maps(me, vec![a.clone()], Vec::new());
    modules.set_maps(NO_SUCH_PID, vec![b.clone()], Vec::new());
    assert_eq!(modules.held(), (2, 1), "two processes, one file");
    // The same code at different addresses: the same (object, offset).
    let fa = modules.normalize(me, &[a.start + 0x101], None);
    let fb = modules.normalize(NO_SUCH_PID, &[b.start + 0x101], None);
    assert_eq!(fa, fb);
    assert!(fa[0].module.is_some());
    modules.drop_process(me);
    modules.drop_process(NO_SUCH_PID);
    assert_eq!(modules.held(), (0, 1), "an interned frame refers to it");
    assert_eq!(modules.path(fa[0].module.expect("module")), a.path);
    assert!(modules
        .objects()
        .open_path(fa[0].module.expect("module"))
        .is_some());
}

#[test]
fn an_object_no_process_maps_and_no_frame_refers_to_is_closed() {
    let mut modules = Modules::default();
    modules.set_maps(NO_SUCH_PID, vec![exe_mapping(0)], Vec::new());
    assert_eq!(modules.held(), (1, 1));
    modules.drop_process(NO_SUCH_PID);
    assert_eq!(modules.held(), (0, 0));
    // Its slot is reused by the next file.
    let m = exe_mapping(0);
    modules.set_maps(NO_SUCH_PID + 1, vec![m.clone()], Vec::new());
    let frames = modules.normalize(NO_SUCH_PID + 1, &[m.start + 0x11], None);
    assert_eq!(frames[0].module, Some(0));
}

#[test]
fn exec_keeps_the_objects_of_old_frames_and_unchanged_maps_keep_their_generation() {
    let mut modules = Modules::default();
    let m = exe_mapping(0);
    modules.set_maps(NO_SUCH_PID, vec![m.clone()], Vec::new());
    let old = modules.normalize(NO_SUCH_PID, &[m.start + 0x11], None);
    modules.forget(NO_SUCH_PID);
    assert!(modules.maps(NO_SUCH_PID).is_empty());
    assert_eq!(modules.held().1, 1, "the old image's frame keeps it");
    modules.set_maps(NO_SUCH_PID, vec![m.clone()], Vec::new());
    let generation = modules.generation(NO_SUCH_PID);
    modules.merge_maps(NO_SUCH_PID, vec![m.clone()]);
    assert_eq!(modules.generation(NO_SUCH_PID), generation);
    assert_eq!(modules.normalize(NO_SUCH_PID, &[m.start + 0x11], None), old);
}

/// Where kernel walks ended is kept while the code is the same: a data
/// file mapped or unmapped does not make the next end a first one (each
/// of which reads the maps soon).
#[test]
fn where_walks_ended_is_forgotten_when_code_changes_only() {
    let mut modules = Modules::default();
    let pid = NO_SUCH_PID;
    let file = |path: &str, start: u64, executable: bool| Mapping {
        start,
        end: start + 0x2000,
        offset: 0,
        executable,
        path: path.to_string(),
        dev_inode: (0, 0),
    };
    let lib = file("/lib/a.so", 0x7f00_0000_1000, true);
    modules.set_maps(pid, vec![lib.clone()], Vec::new());
    let ended_at = |modules: &Modules| modules.procs.get(&pid).map_or(0, |p| p.reads.walk_ends());
    // Given a walk that ended in the library
    if let Some(p) = modules.procs.get_mut(&pid) {
        p.reads.after_walk_end(lib.start + 0x10, Instant::now());
    }
    assert_eq!(ended_at(&modules), 1);
    // When a data file is mapped, then another in its place
    modules.merge_maps(
        pid,
        vec![lib.clone(), file("/data/a.db", 0x7f00_1000_0000, false)],
    );
    modules.merge_maps(
        pid,
        vec![lib.clone(), file("/data/b.db", 0x7f00_1000_0000, false)],
    );
    // Then where the walk ended is kept
    assert_eq!(ended_at(&modules), 1);
    // And another library where the first was forgets it
    modules.merge_maps(pid, vec![file("/lib/b.so", lib.start, true)]);
    assert_eq!(ended_at(&modules), 0);
}

#[test]
fn a_file_mapped_again_is_found_by_the_maps_id_without_opening_it() {
    let mut modules = Modules::default();
    let me = std::process::id();
    let a = exe_mapping(0);
    assert_ne!(a.dev_inode.1, 0, "the maps give the inode");
    modules.set_maps(me, vec![a.clone()], Vec::new());
    assert_eq!(
        modules.objects.found_by_maps_id(),
        1,
        "opened through map_files"
    );
    // Another process maps the same file under a path that opens nothing
    // here: the maps' (device, inode) alone names the object.
    let b = Mapping {
        path: "/no/such/file".into(),
        ..exe_mapping(0x1000_0000)
    };
    modules.set_maps(NO_SUCH_PID, vec![b.clone()], Vec::new());
    assert_eq!(modules.held(), (2, 1), "two processes, one file");
    let fa = modules.normalize(me, &[a.start + 0x101], None);
    let fb = modules.normalize(NO_SUCH_PID, &[b.start + 0x101], None);
    assert_eq!(fa, fb);
    assert_eq!(modules.path(fb[0].module.expect("module")), a.path);
}

#[test]
fn the_maps_id_cache_goes_with_its_object_and_another_inode_misses_it() {
    let mut modules = Modules::default();
    let me = std::process::id();
    let a = exe_mapping(0);
    modules.set_maps(me, vec![a.clone()], Vec::new());
    // A file replaced on disk is another inode: not the cached object.
    let replaced = Mapping {
        path: "/no/such/file".into(),
        dev_inode: (a.dev_inode.0, a.dev_inode.1 + 1),
        ..exe_mapping(0x1000_0000)
    };
    modules.set_maps(NO_SUCH_PID, vec![replaced.clone()], Vec::new());
    assert_eq!(modules.held(), (2, 2), "an unopened object of its own");
    modules.drop_process(NO_SUCH_PID);
    modules.drop_process(me);
    assert_eq!(modules.held(), (0, 0));
    assert_eq!(
        modules.objects.found_by_maps_id(),
        0,
        "freed with the object"
    );
    // Once the object is gone its id names nothing: an unopenable path
    // stays unopened.
    let b = Mapping {
        path: "/no/such/file".into(),
        ..a.clone()
    };
    modules.set_maps(NO_SUCH_PID, vec![b], Vec::new());
    assert!(modules.objects().open_path(0).is_none());
}

/// A mapping of this test process of another file than its executable
/// (its libc, its loader).
fn other_file_mapping(exe: &Mapping) -> Mapping {
    let text = std::fs::read("/proc/self/maps").expect("own maps");
    crate::tracee::process::parse_maps(&text)
        .into_iter()
        .find(|m| m.dev_inode != exe.dev_inode)
        .expect("a mapping of another file than the test binary")
}

/// btrfs shows the filesystem's device in the maps for every subvolume,
/// while inode numbers repeat across subvolumes: two files, one maps id.
#[test]
fn two_files_the_maps_show_with_one_id_are_two_objects() {
    let mut modules = Modules::default();
    let me = std::process::id();
    let exe = exe_mapping(0);
    let other = other_file_mapping(&exe);
    // Given both shown with a device that is neither file's own
    let shown = (exe.dev_inode.0 ^ 0xff, exe.dev_inode.1);
    let a = Mapping {
        dev_inode: shown,
        ..exe.clone()
    };
    let b = Mapping {
        dev_inode: shown,
        ..other.clone()
    };
    modules.set_maps(me, vec![a.clone()], Vec::new());
    modules.set_maps(NO_SUCH_PID, vec![b.clone()], Vec::new());
    // Then each mapping names its own file
    assert_eq!(modules.held(), (2, 2), "two processes, two files");
    let fa = modules.normalize(me, &[a.start + 0x11], None);
    let fb = modules.normalize(NO_SUCH_PID, &[b.start + 0x11], None);
    assert_ne!(fa[0].module, fb[0].module);
    assert_eq!(modules.path(fb[0].module.expect("module")), other.path);
    assert_eq!(
        modules.objects.found_by_maps_id(),
        0,
        "no id that is not the file's own"
    );
}

/// After an exec nothing of the old image is described to the kernel's
/// walker: neither its files nor its JIT code.
#[test]
fn exec_forgets_the_old_images_jit_code_and_walk_ends() {
    let mut modules = Modules::default();
    let pid = NO_SUCH_PID;
    let m = exe_mapping(0);
    // Given a process with JIT code, and a walk that ended in it
    let jit = 0x7f00_0000_0000..0x7f00_0001_0000;
    modules.set_maps(pid, vec![m], vec![jit]);
    if let Some(p) = modules.procs.get_mut(&pid) {
        p.reads.after_walk_end(0x7f00_0000_0010, Instant::now());
    }
    // When it exec'ed
    modules.forget(pid);
    // Then neither is kept
    assert!(modules.jit(pid).is_empty());
    assert!(modules
        .procs
        .get(&pid)
        .is_some_and(|p| p.reads.walk_ends() == 0));
}

#[test]
fn a_forked_child_takes_its_parents_maps_and_objects() {
    let mut modules = Modules::default();
    let me = std::process::id();
    let a = exe_mapping(0);
    modules.set_maps(me, vec![a.clone()], Vec::new());
    assert!(modules.forked(me, NO_SUCH_PID));
    assert_eq!(modules.held(), (2, 1));
    assert_eq!(modules.maps(NO_SUCH_PID), modules.maps(me));
    assert_eq!(
        modules.normalize(NO_SUCH_PID, &[a.start + 0x11], None),
        modules.normalize(me, &[a.start + 0x11], None)
    );
    modules.drop_process(me);
    assert_eq!(modules.held(), (1, 1), "the child still maps it");
    assert!(
        !modules.forked(NO_SUCH_PID + 1, NO_SUCH_PID + 2),
        "unknown parent"
    );
}
