//! CPython 3.12 and 3.13 with `-X perf` and `-X perf_jit`: each Python
//! function is entered through its own trampoline in anonymous executable
//! memory, named in the perf map, without a frame pointer. Traced as a
//! command, exact, a script allocating from three nested functions
//! (tests/targets/py_nested.py): nearly every allocated byte is under a
//! stack complete to `_start` (before the trampolines were walked by
//! their rule: 1 %, every stack ended at the first Python frame), and
//! every block from the innermost function is under the three Python
//! functions, named, in order.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use serde_json::Value;

use crate::harness::{target_source, JsonTracer, Target};

/// pyenv's newest CPython `minor` (a version such as "3.12"; not the
/// free-threaded builds), installed by `cargo xtask setup`.
fn pyenv_python(minor: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".pyenv"),
        PathBuf::from,
    );
    let prefix = format!("{minor}.");
    let newest = std::fs::read_dir(root.join("versions"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|v| {
            let patch: u32 = v.strip_prefix(&prefix)?.parse().ok()?;
            Some((patch, v))
        })
        .max();
    let bin = newest.map(|(_, v)| {
        root.join("versions")
            .join(v)
            .join(format!("bin/python{minor}"))
    });
    bin.filter(|b| b.is_file()).unwrap_or_else(|| {
        panic!(
            "no pyenv CPython {minor} under {}: run `cargo xtask setup`",
            root.display()
        )
    })
}

/// Functions and modules of a stack's frames, leaf first.
fn frames(stack: &Value) -> Vec<(String, String)> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| {
            let text = |k: &str| f[k].as_str().unwrap_or("").to_string();
            (text("function"), text("module"))
        })
        .collect()
}

/// Traces `python -X MODE py_nested.py` as a command and checks its
/// stacks.
fn python_by_command(tag: &str, minor: &str, mode: &str) {
    let python = pyenv_python(minor);
    let script = target_source("py_nested.py");
    let mut args: Vec<OsString> = vec!["--".into(), python.into()];
    args.extend(["-X", mode].map(OsString::from));
    args.push(script.clone().into());
    let (report, out) = JsonTracer::start(tag, &args).finish();
    check_stacks(&report, &script, &out.stderr);
}

/// Checks that nearly all allocated bytes are under stacks complete to
/// `_start`, and that every block from leaf() is under leaf, middle and
/// outer, named from the perf map, in order, complete.
fn check_stacks(report: &Value, script: &Path, stderr: &str) {
    let stacks = report["stacks"].as_array().expect("stacks");
    let bytes = |s: &Value| s["alloc_bytes"].as_u64().expect("alloc_bytes");
    let total: u64 = stacks.iter().map(bytes).sum();
    let complete =
        |s: &Value| s["truncated"] == false && frames(s).last().is_some_and(|f| f.0 == "_start");
    let under_complete: u64 = stacks.iter().filter(|s| complete(s)).map(bytes).sum();
    let cut: Vec<_> = (stacks.iter())
        .filter(|s| !complete(s))
        .take(3)
        .map(frames)
        .collect();
    let share = under_complete as f64 / total as f64;
    assert!(
        share >= 0.9,
        "{:.1} % of {total} allocated bytes under complete stacks; cut: {cut:#?}\n{stderr}",
        100.0 * share,
    );
    let name = |f: &str| format!("py::{f}:{}", script.display());
    let leaf: Vec<&Value> = (stacks.iter())
        .filter(|s| frames(s).iter().any(|f| f.0 == name("leaf")))
        .collect();
    let objects: u64 = leaf
        .iter()
        .map(|s| s["alloc_objects"].as_u64().expect("objects"))
        .sum();
    assert_eq!(objects, 2000, "blocks under leaf(); cut: {cut:#?}");
    for s in leaf {
        let f = frames(s);
        let at = |n: &str| f.iter().position(|f| f.0 == name(n));
        let (l, m, o) = (at("leaf"), at("middle"), at("outer"));
        assert!(l < m && m < o && o.is_some(), "{f:#?}");
        let jit = |f: &(String, String)| !f.0.starts_with("py::") || f.1 == "[jit]";
        assert!(f.iter().all(jit), "{f:#?}");
        assert!(complete(s), "{f:#?}");
    }
}

#[test]
fn python_3_12_perf_stacks_cross_the_trampolines_to_start() {
    python_by_command("python-3.12-perf", "3.12", "perf");
}

#[test]
fn python_3_13_perf_stacks_cross_the_trampolines_to_start() {
    python_by_command("python-3.13-perf", "3.13", "perf");
}

#[test]
fn python_3_13_perf_jit_stacks_cross_the_trampolines_to_start() {
    python_by_command("python-3.13-perf-jit", "3.13", "perf_jit");
}

/// The same in user space, every stack copied and unwound by framehop;
/// by pid, so that the maps are read (at the attach) while the
/// trampolines are mapped: run as a command, a script shorter than the
/// tracer's lag behind its events has them unmapped before it reads the
/// maps, and its walks through them end there (docs/jit-names.md).
#[test]
fn python_3_12_perf_stacks_cross_the_trampolines_in_dwarf_mode() {
    let python = pyenv_python("3.12");
    let script = target_source("py_nested.py");
    let path = script.to_str().expect("utf-8 path");
    let mut target = Target::start(&python, &["-X", "perf", path, "wait"]);
    let pid = target.pid().to_string();
    let args = ["--unwind", "dwarf", "--pid", pid.as_str()];
    let tracer = JsonTracer::start("python-3.12-dwarf", &args);
    target.run_sites();
    let (report, out) = tracer.stop();
    drop(target);
    check_stacks(&report, &script, &out.stderr);
}
