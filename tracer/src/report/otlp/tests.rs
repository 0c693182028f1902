//! The export request decoded back, as a collector reads it: the tables'
//! zero entries, one profile per sample type per process, exact values,
//! stacks leaf first, resources.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message as _;

use super::proto::opentelemetry::proto::collector::profiles::v1development::ExportProfilesServiceRequest;
use super::*;
use crate::report::fixtures::{counts, frame, inlined};
use crate::report::pprof::LOAD_BIAS;
use crate::report::Frame;

fn stack(pid: u32, counts: Counts, frames: Vec<Frame>, truncated: bool) -> StackReport {
    StackReport {
        pid,
        start_time: Some(7),
        counts,
        frames: frames.into_iter().map(Arc::new).collect(),
        truncated,
        ..Default::default()
    }
}

fn profile() -> Profile {
    let main = frame("main", "/opt/app", 0x1890, Some(("app.c", 9)));
    Profile {
        sample_rate: 1,
        duration_secs: 2.5,
        processes: vec![
            ProcessInfo {
                pid: 41,
                start_time: Some(7),
                command: "/opt/app --serve".into(),
                program: "/opt/app".into(),
                identity: crate::profile::Identity {
                    cgroup: Some("/kubepods.slice/x/cri-containerd-0123456789ab.scope".into()),
                    container_id: Some("0123456789ab".into()),
                    pod_uid: Some("6e5f3c1a-2b7d-4e8f-9a0b-1c2d3e4f5a6b".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            ProcessInfo {
                pid: 42,
                start_time: Some(7),
                command: "worker\x1b[2J".into(),
                ..Default::default()
            },
        ],
        stacks: vec![
            stack(
                41,
                counts(1000, 10, 4000, 40),
                vec![
                    inlined(frame("helper", "/opt/app", 0x1234, Some(("app.c", 3)))),
                    frame("site_a", "/opt/app", 0x1234, Some(("app.c", 5))),
                    main.clone(),
                ],
                false,
            ),
            stack(
                41,
                counts(0, 0, 96, 2),
                vec![frame("site_b", "/opt/app", 0x1300, None), main],
                true,
            ),
            stack(42, counts(64, 1, 64, 1), Vec::new(), false),
        ],
        ..Default::default()
    }
}

fn decoded(p: &Profile) -> ExportProfilesServiceRequest {
    let host = Host {
        name: "box".into(),
        ..Host::default()
    };
    let bytes = otlp_request(p, &host).encode_to_vec();
    ExportProfilesServiceRequest::decode(bytes.as_slice()).expect("decodes")
}

/// Per sample type per pid: leaf-first function names -> value.
type Samples = BTreeMap<(String, i64), BTreeMap<Vec<String>, i64>>;

fn samples(r: &ExportProfilesServiceRequest) -> Samples {
    let d = r.dictionary.as_ref().expect("dictionary");
    let s = |i: i32| d.string_table[i as usize].clone();
    let mut out = Samples::new();
    for rp in &r.resource_profiles {
        let pid = rp
            .resource
            .as_ref()
            .and_then(|res| res.attributes.iter().find(|a| a.key == "process.pid"))
            .and_then(|a| match a.value.as_ref()?.value {
                Some(any_value::Value::IntValue(v)) => Some(v),
                _ => None,
            })
            .expect("process.pid");
        for prof in &rp.scope_profiles[0].profiles {
            let kind = s(prof.sample_type.expect("sample type").type_strindex);
            let e = out.entry((kind, pid)).or_default();
            for sample in &prof.samples {
                let stack = &d.stack_table[sample.stack_index as usize];
                let names = stack
                    .location_indices
                    .iter()
                    .flat_map(|&l| &d.location_table[l as usize].lines)
                    .map(|line| s(d.function_table[line.function_index as usize].name_strindex))
                    .collect();
                e.insert(names, sample.values[0]);
            }
        }
    }
    out
}

#[test]
fn every_table_starts_with_its_zero_value() {
    let r = decoded(&profile());
    let d = r.dictionary.expect("dictionary");
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.mapping_table[0], pb::Mapping::default());
    assert_eq!(d.location_table[0], pb::Location::default());
    assert_eq!(d.function_table[0], pb::Function::default());
    assert_eq!(d.stack_table[0], pb::Stack::default());
    assert_eq!(d.attribute_table[0], pb::KeyValueAndUnit::default());
    assert_eq!(d.link_table[0].trace_id, vec![0; 16]);
    // Each distinct string once.
    let mut strings = d.string_table.clone();
    strings.sort();
    strings.dedup();
    assert_eq!(strings.len(), d.string_table.len());
}

#[test]
fn one_profile_per_sample_type_per_process_with_exact_values() {
    let r = decoded(&profile());
    assert_eq!(r.resource_profiles.len(), 2);
    for rp in &r.resource_profiles {
        let d = r.dictionary.as_ref().expect("dictionary");
        let kinds: Vec<(&str, &str)> = rp.scope_profiles[0]
            .profiles
            .iter()
            .map(|p| {
                let t = p.sample_type.expect("sample type");
                (
                    d.string_table[t.type_strindex as usize].as_str(),
                    d.string_table[t.unit_strindex as usize].as_str(),
                )
            })
            .collect();
        assert_eq!(kinds, SAMPLE_TYPES);
        let p = &rp.scope_profiles[0].profiles[0];
        assert_eq!(p.duration_nano, 2_500_000_000);
        assert_eq!(p.period, 1);
    }
    let got = samples(&r);
    let v = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let site_a = v(&["helper", "site_a", "main"]);
    let site_b = v(&["site_b", "main", "[truncated]"]);
    let none = v(&["[no stack]"]);
    let want = |kind: &str, pid, entries: &[(&Vec<String>, i64)]| {
        assert_eq!(
            got[&(kind.to_string(), pid)],
            entries.iter().map(|(k, v)| ((*k).clone(), *v)).collect(),
            "{kind} of pid {pid}"
        );
    };
    want("inuse_space", 41, &[(&site_a, 1000)]);
    want("inuse_objects", 41, &[(&site_a, 10)]);
    want("alloc_space", 41, &[(&site_a, 4000), (&site_b, 96)]);
    want("alloc_objects", 41, &[(&site_a, 40), (&site_b, 2)]);
    want("inuse_space", 42, &[(&none, 64)]);
}

#[test]
fn resources_name_the_process_and_the_host_escaped() {
    let r = decoded(&profile());
    let attrs = |i: usize| -> BTreeMap<String, String> {
        r.resource_profiles[i]
            .resource
            .as_ref()
            .expect("resource")
            .attributes
            .iter()
            .map(|a| {
                let v = match a.value.as_ref().and_then(|v| v.value.clone()) {
                    Some(any_value::Value::StringValue(s)) => s,
                    Some(any_value::Value::IntValue(n)) => n.to_string(),
                    other => panic!("{other:?}"),
                };
                (a.key.clone(), v)
            })
            .collect()
    };
    let first = attrs(0);
    assert_eq!(first["process.pid"], "41");
    assert_eq!(first["process.executable.path"], "/opt/app");
    assert_eq!(first["process.executable.name"], "app");
    assert_eq!(first["process.command_line"], "/opt/app --serve");
    assert_eq!(first["host.name"], "box");
    assert_eq!(first["service.name"], "unknown_service:app");
    assert_eq!(first["container.id"], "0123456789ab");
    assert_eq!(first["k8s.pod.uid"], "6e5f3c1a-2b7d-4e8f-9a0b-1c2d3e4f5a6b");
    assert_eq!(
        first["process.cgroup"],
        "/kubepods.slice/x/cri-containerd-0123456789ab.scope"
    );
    let second = attrs(1);
    assert_eq!(second["process.executable.path"], "worker\\x1b[2J");
    assert!(!second.contains_key("container.id"), "{second:?}");
}

#[test]
fn mappings_are_page_ranges_holding_their_locations() {
    let r = decoded(&profile());
    let d = r.dictionary.expect("dictionary");
    assert_eq!(d.mapping_table.len(), 2, "one file: {:?}", d.mapping_table);
    let m = &d.mapping_table[1];
    assert_eq!(d.string_table[m.filename_strindex as usize], "/opt/app");
    assert_eq!(m.file_offset, 0x1000);
    for l in d.location_table.iter().filter(|l| l.mapping_index == 1) {
        assert!(
            (m.memory_start..m.memory_limit).contains(&l.address),
            "{l:?} in {m:?}"
        );
        assert_eq!(
            l.address - m.memory_start + m.file_offset,
            l.address - LOAD_BIAS
        );
    }
}

#[test]
fn the_environment_names_the_service_and_adds_attributes_the_process_does_not_set() {
    let host = Host {
        name: "box".into(),
        service_name: Some("checkout".into()),
        attributes: vec![
            ("deployment.environment".into(), "prod\u{1b}[2J".into()),
            ("process.pid".into(), "1".into()),
        ],
    };
    let request = otlp_request(&profile(), &host);
    let attrs = &request.resource_profiles[0]
        .resource
        .as_ref()
        .expect("resource")
        .attributes;
    let get = |key: &str| -> Vec<String> {
        attrs
            .iter()
            .filter(|a| a.key == key)
            .map(|a| format!("{:?}", a.value.as_ref().and_then(|v| v.value.clone())))
            .collect()
    };
    assert_eq!(get("service.name"), [r#"Some(StringValue("checkout"))"#]);
    // Escaped, as every string the profile carries.
    assert_eq!(
        get("deployment.environment"),
        [r#"Some(StringValue("prod\\x1b[2J"))"#]
    );
    // The process's own pid, not the environment's.
    assert_eq!(get("process.pid"), ["Some(IntValue(41))"]);
}
