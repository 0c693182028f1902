//! Frames of a process whose maps are set by hand; files that open
//! nothing, no process's /proc.

use super::*;
use crate::stacks::modules::code_history::CodeHistory;
use crate::tracee::process::Mapping;
use tracer_common::{CodeMaps, CodeRange, CODE_HISTORY};

/// A pid that no process has.
const NO_SUCH_PID: u32 = 1 << 23;

fn lib(path: &str, start: u64, offset: u64) -> Mapping {
    Mapping {
        start,
        end: start + 0x1000,
        offset,
        executable: true,
        path: path.to_string(),
        dev_inode: (0, 0),
    }
}

/// A process mapping `maps`, its objects in `objects` (retained).
fn process(objects: &mut ObjectTable, maps: Vec<Mapping>) -> Proc {
    let mut p = Proc::new(1);
    p.maps.merge(maps, |m| objects.identify(NO_SUCH_PID, m));
    for &o in p.maps.objects() {
        objects.retain(o);
    }
    p
}

#[test]
fn an_address_in_a_file_is_its_file_offset_and_keeps_the_object() {
    let (mut objects, mut jit) = (ObjectTable::default(), JitFrames::default());
    let a = lib("/no/such/a.so", 0x7f00_0000_0000, 0x3000);
    let p = process(&mut objects, vec![a.clone()]);
    let mut stats = CodeStats::default();
    let frames = Normalizer {
        pid: NO_SUCH_PID,
        proc: Some(&p),
        objects: &mut objects,
        jit: &mut jit,
    }
    .stack(&[a.start + 0x11, 0x1234], None, &mut stats);
    // The return address minus one, as an offset in the file; an address
    // in no file stays raw
    assert_eq!(frames[0].offset, 0x3010);
    let module = frames[0].module.expect("in a.so");
    assert_eq!(frames[1], raw(0x1233));
    // The interned frame keeps its object after the process is gone
    objects.release(module);
    assert_eq!(objects.path(module), Some("/no/such/a.so"));
    assert_eq!(stats, CodeStats::default());
}

#[test]
fn a_frame_where_code_was_mapped_since_its_stack_stays_unnamed_and_is_counted() {
    let (mut objects, mut jit) = (ObjectTable::default(), JitFrames::default());
    let b = lib("/no/such/b.so", 0x7f00_0000_0000, 0);
    let mut p = process(&mut objects, vec![b.clone()]);
    // Given b.so mapped at generation 3 where other code was, the maps
    // read at 3
    let mut maps = CodeMaps {
        gen: 3,
        _pad: 0,
        ranges: [CodeRange::default(); CODE_HISTORY],
    };
    maps.ranges[3] = CodeRange {
        start: b.start,
        len: 0x1000,
        gen: 3,
    };
    p.code = CodeHistory::at_read(Some(&maps));
    let mut stats = CodeStats::default();
    let mut names = Normalizer {
        pid: NO_SUCH_PID,
        proc: Some(&p),
        objects: &mut objects,
        jit: &mut jit,
    };
    // When a stack taken at generation 2 is named
    let frames = names.stack(&[b.start + 0x11], Some(2), &mut stats);
    // Then its frame there is left a raw address, and counted
    assert_eq!(frames, [raw(b.start + 0x10)]);
    assert_eq!(stats.replaced, 1);
    // A stack taken at 3 is b.so's
    let frames = names.stack(&[b.start + 0x11], Some(3), &mut stats);
    assert!(frames[0].module.is_some());
    assert_eq!(stats.replaced, 1);
    // A stack older than the history reaches is counted as such
    names.stack(
        &[b.start + 0x11],
        Some(3u32.wrapping_sub(CODE_HISTORY as u32 + 1)),
        &mut stats,
    );
    assert_eq!(stats.beyond_history, 1);
}

#[test]
fn an_unknown_process_has_raw_frames_and_no_jit_names() {
    let (mut objects, mut jit) = (ObjectTable::default(), JitFrames::default());
    let mut names = Normalizer {
        pid: NO_SUCH_PID,
        proc: None,
        objects: &mut objects,
        jit: &mut jit,
    };
    let frames = names.stack(&[0x1001], Some(7), &mut CodeStats::default());
    assert_eq!(frames, [raw(0x1000)]);
    assert_eq!(names.name_jit(&frames), None);
}
