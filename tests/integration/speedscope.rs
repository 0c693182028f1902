//! `--format speedscope`: the file validates against the schema shipped in
//! speedscope's npm package (installed by `cargo xtask setup`), and its
//! profiles carry the target's exact numbers, one per view.

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use serde_json::Value;

use crate::{
    harness::{compile_c, root_or_skip, scratch, Target, Tracer},
    sites::{EXPECTED_PER_THREAD, O2_FLAGS, THREADS},
};

/// The schema in the npm package, under the target directory.
fn schema() -> PathBuf {
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let path =
        target.join("speedscope/node_modules/speedscope/dist/release/file-format-schema.json");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask setup` (it installs the speedscope npm package)",
        path.display()
    );
    path
}

/// Validates `file` against the schema with python3-jsonschema.
fn validate(file: &std::path::Path) {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import json, sys, jsonschema\n\
             schema = json.load(open(sys.argv[1]))\n\
             doc = json.load(open(sys.argv[2]))\n\
             jsonschema.validate(doc, schema)\n\
             print('valid')",
        ])
        .arg(schema())
        .arg(file)
        .output()
        .expect("run python3 (python3-jsonschema: cargo xtask setup)");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("valid"),
        "schema validation failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Per leaf frame, the summed weights of the profile named `name`.
fn per_leaf(doc: &Value, name: &str) -> BTreeMap<String, u64> {
    let frames = doc["shared"]["frames"].as_array().expect("frames");
    let profile = doc["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no profile {name}: {}", doc["profiles"]));
    let mut out = BTreeMap::new();
    let samples = profile["samples"].as_array().expect("samples");
    let weights = profile["weights"].as_array().expect("weights");
    for (stack, weight) in samples.iter().zip(weights) {
        let leaf = stack.as_array().and_then(|s| s.last()).expect("a frame");
        let leaf = frames[leaf.as_u64().expect("index") as usize]["name"]
            .as_str()
            .expect("name");
        *out.entry(leaf.to_string()).or_default() += weight.as_u64().expect("weight");
    }
    out
}

#[test]
fn a_speedscope_file_validates_against_the_schema_and_holds_exact_numbers() {
    if !root_or_skip("a_speedscope_file_validates_against_the_schema_and_holds_exact_numbers") {
        return;
    }
    let bin = compile_c("sites", "speedscope", O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let file = scratch("sites.speedscope.json");
    let pid = target.pid().to_string();
    let tracer = Tracer::start(&[
        "--pid",
        &pid,
        "--format",
        "speedscope",
        "-o",
        file.to_str().expect("utf-8 path"),
    ]);
    target.run_sites();
    tracer.signal(libc::SIGINT);
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    validate(&file);
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("JSON");
    let views = [
        "in-use bytes",
        "in-use objects",
        "allocated bytes",
        "allocated objects",
    ];
    let got: Vec<BTreeMap<String, u64>> = views.iter().map(|v| per_leaf(&doc, v)).collect();
    for (site, per_thread) in EXPECTED_PER_THREAD {
        for (i, view) in views.iter().enumerate() {
            let want = per_thread[i] * THREADS;
            assert_eq!(
                got[i].get(*site).copied().unwrap_or(0),
                want,
                "{site}, {view}: {:?}",
                got[i]
            );
        }
    }
}
