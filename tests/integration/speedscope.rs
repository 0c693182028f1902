//! `--format speedscope`: the file validates against the schema shipped in
//! speedscope's npm package (installed by `cargo xtask setup`), its
//! profiles carry the target's exact numbers, one per view, and the
//! packaged speedscope app opens it in headless Chromium.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::harness::{
    chromium,
    chromium::FileServer,
    compile_c, scratch,
    sites::{EXPECTED_PER_THREAD, O2_FLAGS, THREADS},
    Target, Tracer,
};

/// The npm package's app and schema, under the target directory.
fn release_dir() -> PathBuf {
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_path_buf();
    let dir = target.join("speedscope/node_modules/speedscope/dist/release");
    assert!(
        dir.join("file-format-schema.json").is_file() && dir.join("index.html").is_file(),
        "{} is missing: run `cargo xtask setup` (it installs the speedscope npm package)",
        dir.display()
    );
    dir
}

/// The schema in the npm package.
fn schema() -> PathBuf {
    release_dir().join("file-format-schema.json")
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

/// A speedscope file of the sites target (both threads, exact mode).
fn trace_sites(tag: &str) -> PathBuf {
    let bin = compile_c("sites", tag, O2_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let file = scratch(&format!("{tag}.speedscope.json"));
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
    file
}

#[test]
fn a_speedscope_file_validates_against_the_schema_and_holds_exact_numbers() {
    let file = trace_sites("speedscope");
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

/// A byte count as speedscope shows it (its `ByteFormatter`: 1024-based
/// units, two decimals past bytes, rounded as JavaScript's `toFixed`
/// does: a tie goes up, where Rust's `{:.2}` goes to even).
fn speedscope_bytes(bytes: u64) -> String {
    let fixed = |v: f64| format!("{:.2}", (v * 100.0).round() / 100.0);
    let mut value = bytes as f64;
    if value < 1024.0 {
        return format!("{value:.0} B");
    }
    for unit in ["KB", "MB"] {
        value /= 1024.0;
        if value < 1024.0 {
            return format!("{} {unit}", fixed(value));
        }
    }
    format!("{} GB", fixed(value / 1024.0))
}

/// The packaged app (`dist/release/index.html`, served from
/// loopback with our file, which it fetches through `#profileURL=`) shows
/// our profiles by name, and its sandwich view (`&view=sandwich`: the one
/// view that is a DOM table rather than a canvas) lists every site with
/// its exact in-use bytes.
#[test]
fn headless_chromium_opens_our_file_in_the_speedscope_app() {
    let file = trace_sites("speedscope-chromium");
    let ours = std::fs::read(&file).expect("read our file");
    let server = FileServer::start(
        &release_dir(),
        HashMap::from([("ours.speedscope.json".to_string(), ours)]),
    );
    let url = format!(
        "{0}/index.html#profileURL={0}/ours.speedscope.json&view=sandwich",
        server.url()
    );
    let budget = Duration::from_secs(10);
    let dom = chromium::dump_dom(&url, budget);
    let text = chromium::page_text(&dom);
    assert!(
        server.asked().iter().any(|p| p == "/ours.speedscope.json"),
        "speedscope did not fetch our file: {:?}",
        server.asked()
    );
    assert!(!text.contains("Something went wrong"), "{text}");
    // The profile shown first (--view's), and the list of all six.
    assert!(text.contains("in-use bytes (1/6)"), "{text}");
    for name in [
        "in-use bytes",
        "in-use objects",
        "allocated bytes",
        "allocated objects",
        "bytes in use at the peak",
        "objects in use at the peak",
    ] {
        assert!(text.contains(name), "no profile {name:?} in: {text}");
    }
    // Sandwich rows: total, self, symbol name.
    let rows = chromium::table_rows(&dom);
    for (site, per_thread) in EXPECTED_PER_THREAD {
        if per_thread[0] == 0 {
            // Nothing in use: no sample of this view holds it.
            assert!(
                !rows
                    .iter()
                    .any(|r| r.last().map(String::as_str) == Some(*site)),
                "{site} keeps nothing but has a row: {rows:?}"
            );
            continue;
        }
        let want = speedscope_bytes(per_thread[0] * THREADS);
        let row = rows
            .iter()
            .find(|r| r.last().map(String::as_str) == Some(*site))
            .unwrap_or_else(|| panic!("no sandwich row for {site}: {rows:?}"));
        assert!(
            row.len() == 3 && row[0].starts_with(&format!("{want} (")),
            "{site}: want total {want}, row {row:?}"
        );
        assert!(row[1].starts_with(&format!("{want} (")), "{site}: {row:?}");
    }
    let shot = chromium::artefact("speedscope.png");
    chromium::screenshot(&url, budget, &shot, 1280, 800);
}
