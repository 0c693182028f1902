use super::Note;

#[test]
fn a_larger_window_is_suggested_only_below_the_largest() {
    let max = tracer_common::MAX_STACK_BYTES as u32;
    let cut = |stack_bytes| {
        Note::StacksCut {
            stacks: 1,
            stack_bytes,
        }
        .to_string()
    };
    let below = cut(max / 2);
    assert!(
        below.contains(&format!("raise --stack-bytes, up to {max}")),
        "{below}"
    );
    let at_max = cut(max);
    assert!(!at_max.contains("raise --stack-bytes"), "{at_max}");
    assert!(at_max.contains("--unwind fp"), "{at_max}");
}

fn walks_cut(at_limit: u64, copy_cut: u64, stack_bytes: u32) -> String {
    Note::KernelWalksCut {
        stacks: 2,
        at_limit,
        unsupported: 0,
        read_failed: 0,
        bad_frame: 0,
        copy_cut,
        stack_bytes,
        max_frames: 512,
    }
    .to_string()
}

/// Tables mode: stacks cut where a walk was finished from a copy (code
/// mapped since the maps were read: dlopen) say so and name the copy's
/// size and the flag; the frame limit is named only when it was met.
#[test]
fn kernel_walks_finished_from_a_short_copy_say_why_and_what_to_raise() {
    let max = tracer_common::MAX_STACK_BYTES as u32;
    let copy = walks_cut(0, 587, 8192);
    assert!(
        copy.starts_with("2 stacks end early, marked [truncated]; 587 walks at code mapped after"),
        "{copy}"
    );
    assert!(copy.contains("dlopen"), "{copy}");
    assert!(copy.contains("a copy of 8192 stack bytes"), "{copy}");
    assert!(
        copy.contains(&format!("raise --stack-bytes, up to {max}")),
        "{copy}"
    );
    assert!(!copy.contains("512 frames"), "{copy}");
    let at_max = walks_cut(0, 1, max);
    assert!(at_max.contains("1 walk at code mapped"), "{at_max}");
    assert!(!at_max.contains("raise --stack-bytes"), "{at_max}");
    let both = walks_cut(4, 3, 8192);
    assert!(
        both.contains(
            "(kernel walks ended: 4 deeper than the walker's limit of 512 frames); 3 walks"
        ),
        "{both}"
    );
    let limit = walks_cut(4, 0, 8192);
    assert!(!limit.contains("--stack-bytes"), "{limit}");
}

/// JIT frames left [unknown] by a refused perf map or a cap say so.
#[test]
fn refused_debug_links_are_counted_with_one_example() {
    let note = Note::DebugLinksRefused {
        objects: 2,
        example: "/app/prog: ../../etc/shadow".into(),
    }
    .to_string();
    assert_eq!(
        note,
        "2 objects have a debug link that is not a bare file name, not followed \
         (/app/prog: ../../etc/shadow): docs/debug-files.md"
    );
}

#[test]
fn jit_names_incomplete_names_what_was_refused_and_capped() {
    let note = |refused_files, capped_entries, unnamed_frames| {
        Note::JitNamesIncomplete {
            refused_files,
            capped_entries,
            unnamed_frames,
        }
        .to_string()
    };
    let refused = note(1, 0, 0);
    assert!(
        refused.starts_with("JIT names incomplete, frames in the code concerned stay [unknown]: 1 perf map or jitdump file was refused (a symbolic link"),
        "{refused}"
    );
    assert!(!refused.contains("caps"), "{refused}");
    let capped = note(0, 4_800_001, 0);
    assert!(
        capped.contains(": 4800001 entries were dropped at a process's caps"),
        "{capped}"
    );
    assert!(!capped.contains("refused"), "{capped}");
    let all = note(2, 1, 3);
    assert!(
        all.contains("2 perf map or jitdump files were refused"),
        "{all}"
    );
    assert!(all.contains("1 entry was dropped"), "{all}");
    assert!(all.contains("3 frames were left unnamed"), "{all}");
}
