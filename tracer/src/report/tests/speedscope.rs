//! speedscope's file: one sampled profile per view and process, frames
//! shared, one frame per function.

use crate::report::fixtures::*;
use crate::report::*;

fn speedscope(p: &Profile, view: View) -> serde_json::Value {
    let mut out = Vec::new();
    write_speedscope(p, view, &mut out).expect("write_speedscope");
    serde_json::from_slice(&out).expect("speedscope output is JSON")
}

#[test]
fn speedscope_has_a_sampled_profile_per_view_and_process_with_shared_frames() {
    let p = two_processes();
    let doc = speedscope(&p, View::AllocObjects);
    assert_eq!(
        doc["$schema"],
        "https://www.speedscope.app/file-format-schema.json"
    );
    let profiles = doc["profiles"].as_array().expect("profiles");
    // pid 101, 102, 103 and the folded group, in four views each.
    assert_eq!(profiles.len(), 4 * 4, "{doc}");
    let active = &profiles[doc["activeProfileIndex"].as_u64().expect("index") as usize];
    assert_eq!(
        active["name"], "allocated objects: server (pid 101)",
        "{active}"
    );
    assert_eq!(active["unit"], "none");
    let names: Vec<&str> = profiles.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(
        names.contains(&"in-use bytes: server (812 exited processes)"),
        "{names:?}"
    );
    let frames = doc["shared"]["frames"].as_array().expect("frames");
    for profile in profiles {
        assert_eq!(profile["type"], "sampled");
        let weights: Vec<u64> = profile["weights"]
            .as_array()
            .expect("weights")
            .iter()
            .filter_map(serde_json::Value::as_u64)
            .collect();
        assert_eq!(
            weights.iter().sum::<u64>(),
            profile["endValue"],
            "{profile}"
        );
        assert_eq!(
            weights.len(),
            profile["samples"].as_array().expect("samples").len()
        );
        assert!(weights.iter().all(|&w| w > 0), "no empty sample: {profile}");
    }
    // Root first: pid 101's stack ends in alloc_table (the leaf) and starts
    // at _start, with file and line where known.
    let first = &profiles[0];
    assert_eq!(first["name"], "in-use bytes: server (pid 101)");
    let stack: Vec<&serde_json::Value> = first["samples"][0]
        .as_array()
        .expect("stack")
        .iter()
        .map(|i| &frames[i.as_u64().expect("index") as usize])
        .collect();
    assert_eq!(stack.first().map(|f| &f["name"]), Some(&"_start".into()));
    let leaf = stack.last().expect("leaf");
    assert_eq!(
        (&leaf["name"], &leaf["file"], &leaf["line"]),
        (&"alloc_table".into(), &"src/table.c".into(), &9.into())
    );
    // Each distinct frame once.
    let mut seen: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
    let all = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), all, "{frames:?}");
}

#[test]
fn speedscope_of_one_process_names_profiles_by_view_only() {
    let doc = speedscope(&one_process(), View::InuseSpace);
    let names: Vec<&str> = doc["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "in-use bytes",
            "in-use objects",
            "allocated bytes",
            "allocated objects",
            "bytes in use at the peak",
            "objects in use at the peak"
        ]
    );
    assert_eq!(doc["activeProfileIndex"], 0);
}

/// speedscope takes name, file and line as a frame's identity: a function
/// called from two of its lines is still one frame, at the lower line.
#[test]
fn speedscope_keeps_one_frame_per_function_whatever_the_call_site_line() {
    let mut p = one_process();
    let at = |line| {
        frame(
            "run",
            "/opt/demo/bin/server",
            0x1000 + line as u64,
            Some(("src/run.c", line)),
        )
    };
    p.stacks = vec![
        stack(
            1,
            counts(10, 1, 10, 1),
            vec![frame("a", APP, 1, None), at(42)],
        ),
        stack(
            1,
            counts(20, 1, 20, 1),
            vec![frame("b", APP, 2, None), at(17)],
        ),
    ];
    let doc = speedscope(&p, View::InuseSpace);
    let runs: Vec<_> = doc["shared"]["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .filter(|f| f["name"] == "run")
        .collect();
    assert_eq!(runs.len(), 1, "{doc}");
    assert_eq!(runs[0]["file"], "src/run.c");
    assert_eq!(runs[0]["line"], 17);
}
