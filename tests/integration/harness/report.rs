//! Reading the JSON reports: frames resolved from the `frames` table.

use serde_json::Value;

/// The JSON report at `path`, parsed, with its frames resolved (see
/// `parse_report`).
pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read report {}: {e}", path.display()));
    parse_report(&text)
}

/// A JSON report, parsed. The report writes each distinct frame once, in
/// the top-level `frames` table, and every stack's `frames` as indices into
/// it; here each index is replaced by its frame object, in every stack list
/// of the document, so tests read `stack["frames"][0]["function"]`.
pub fn parse_report(text: &str) -> Value {
    let mut report: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("report is not JSON ({e}):\n{text}"));
    assert_eq!(report["format"], "memtrace-bpf/2", "report format");
    let map = report.as_object_mut().expect("report is an object");
    let table = match map.remove("frames") {
        Some(Value::Array(table)) => table,
        other => panic!("report without a frame table (frames: {other:?})"),
    };
    map.values_mut().for_each(|v| resolve_frames(v, &table));
    map.insert("frames".to_string(), Value::Array(table));
    report
}

/// Replaces the indices of every `frames` list under `v` by table entries.
fn resolve_frames(v: &mut Value, table: &[Value]) {
    match v {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key == "frames" {
                    for f in value.as_array_mut().expect("frames is a list") {
                        let i = f.as_u64().unwrap_or_else(|| panic!("frame index {f}"));
                        *f = table
                            .get(i as usize)
                            .unwrap_or_else(|| panic!("frame {i} of a table of {}", table.len()))
                            .clone();
                    }
                } else {
                    resolve_frames(value, table);
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| resolve_frames(item, table)),
        _ => {}
    }
}

/// The report's `processes[]` entry of `pid` (panics, listing them, if none).
pub fn process_entry(report: &Value, pid: impl Into<u64>) -> &Value {
    let pid = pid.into();
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no process {pid}: {}", report["processes"]))
}

/// The pids of the report's `processes[]`, in its order.
pub fn pids(report: &Value) -> Vec<u64> {
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter_map(|p| p["pid"].as_u64())
        .collect()
}

/// A stack's function names, leaf first ("" for a frame without one).
pub fn function_names(stack: &Value) -> Vec<&str> {
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["function"].as_str().unwrap_or(""))
        .collect()
}

/// In-use objects and bytes of the stacks whose innermost frame is
/// `function`.
pub fn inuse_from(report: &Value, function: &str) -> (u64, u64) {
    report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"][0]["function"] == function)
        .fold((0, 0), |(o, b), s| {
            (
                o + s["inuse_objects"].as_u64().expect("objects"),
                b + s["inuse_bytes"].as_u64().expect("bytes"),
            )
        })
}

/// Where the tracer saved a report it could not write where asked, as its
/// stderr says ("it was saved to PATH instead"); panics if it says not.
pub fn saved_elsewhere(stderr: &str) -> &str {
    stderr
        .split("it was saved to ")
        .nth(1)
        .and_then(|rest| rest.split(" instead").next())
        .unwrap_or_else(|| panic!("no saved path in: {stderr}"))
}
