//! `--otlp`: the profile as an OTLP profiles export request
//! (`opentelemetry.proto.collector.profiles.v1development`), the body
//! `otlp/` POSTs to a collector:
//! - one `ResourceProfiles` per process (per folded group of exited
//!   processes), its `Resource` carrying `process.pid`,
//!   `process.executable.path`/`.name`, `process.command_line`, `host.name`,
//!   `service.name` and, where the profile knows them, the container's
//!   identity (`identity_attributes`);
//! - in it one `Profile` per sample type, named as the OpenTelemetry
//!   memory design and Go name them: `inuse_space`/bytes,
//!   `inuse_objects`/count, `alloc_space`/bytes, `alloc_objects`/count;
//! - all of them sharing one `ProfilesDictionary` (strings, functions,
//!   locations, mappings, stacks), whose entry 0 is the zero value as the
//!   proto requires.
//!
//! Values are our weights, already unbiased ("unsampled form", as the
//! proto asks); period type space/bytes, period = the sample rate. A
//! profile covers the trace so far: `time_unix_nano` is the trace's start
//! and `duration_nano` its length, so in-use is the heap now and alloc
//! counts everything since the start (what the proto suggests for a live
//! heap snapshot). Locations are laid out as in pprof (`pprof::LOAD_BIAS`).
//! Strings a traced process controls go through `escape::text`, as pprof's.

use std::collections::HashMap;

use super::pprof_meta::{duration_nanos, saturating_i64, start_nanos};
use super::{basename, Counts, ProcessInfo, Profile, StackReport};
use crate::escape;

/// The generated OTLP message types (only what the profiles export uses).
#[allow(
    clippy::doc_markdown,
    clippy::doc_lazy_continuation,
    clippy::doc_overindented_list_items,
    reason = "generated from the .proto files' comments (which lints fire depends on them)"
)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/otlp.rs"));
}

use proto::opentelemetry::proto::{
    collector::profiles::v1development::ExportProfilesServiceRequest,
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    profiles::v1development as pb,
    resource::v1::Resource,
};

/// The sample types, in the order each resource lists its profiles.
pub const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("inuse_space", "bytes"),
    ("inuse_objects", "count"),
    ("alloc_space", "bytes"),
    ("alloc_objects", "count"),
];

fn sample_value(i: usize, c: &Counts) -> u64 {
    match i {
        0 => c.inuse_bytes,
        1 => c.inuse_objects,
        2 => c.alloc_bytes,
        _ => c.alloc_objects,
    }
}

/// What the resources say that the profile does not: the machine's name,
/// and what the environment adds (OTEL_SERVICE_NAME,
/// OTEL_RESOURCE_ATTRIBUTES).
#[derive(Clone, Debug, Default)]
pub struct Host {
    pub name: String,
    /// `service.name` of every process; None: `unknown_service:PROGRAM`.
    pub service_name: Option<String>,
    /// Added to every resource where the process's own attributes do not
    /// already name the key.
    pub attributes: Vec<(String, String)>,
}

/// The export request for `p` (see the module documentation).
pub fn otlp_request(p: &Profile, host: &Host) -> ExportProfilesServiceRequest {
    let mut d = Dictionary::default();
    let duration = duration_nanos(p.duration_secs);
    // A trace's profile knows its start; now less the duration otherwise.
    let start = p
        .start_unix_ns
        .unwrap_or_else(|| u64::try_from(start_nanos(duration)).unwrap_or(0));
    let header = Header {
        time_unix_nano: start,
        duration_nano: u64::try_from(duration).unwrap_or(0),
        period: saturating_i64(p.sample_rate.max(1)),
    };
    // Stacks by process, processes in the order their first stack comes.
    let mut order: Vec<ProcessKey> = Vec::new();
    let mut by_process: HashMap<ProcessKey, Vec<&StackReport>> = HashMap::new();
    for s in &p.stacks {
        let key = (s.pid, s.start_time, s.exited_group.as_deref());
        by_process
            .entry(key)
            .or_insert_with(|| {
                order.push(key);
                Vec::new()
            })
            .push(s);
    }
    let resource_profiles = order
        .iter()
        .map(|key| {
            let stacks = by_process.get(key).map_or(&[][..], Vec::as_slice);
            let profiles = SAMPLE_TYPES
                .iter()
                .enumerate()
                .map(|(i, &(kind, unit))| d.profile(&header, kind, unit, stacks, i))
                .collect();
            pb::ResourceProfiles {
                resource: Some(Resource {
                    attributes: resource_attributes(p, *key, host),
                    ..Default::default()
                }),
                scope_profiles: vec![pb::ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "memtrace-bpf".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    profiles,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d.finish()),
    }
}

/// A stack's process: pid, start time, folded group's program.
type ProcessKey<'a> = (u32, Option<u64>, Option<&'a str>);

/// What every `Profile` of one request shares.
struct Header {
    time_unix_nano: u64,
    duration_nano: u64,
    period: i64,
}

use dictionary::Dictionary;

/// The resource of one process (a folded group of exited processes has no
/// pid, and its program stands for all of them).
fn resource_attributes(
    p: &Profile,
    (pid, start_time, group): ProcessKey,
    host: &Host,
) -> Vec<KeyValue> {
    let process = match group {
        Some(program) => p
            .processes
            .iter()
            .find(|q| q.folded > 0 && q.program == program),
        None => p
            .processes
            .iter()
            .find(|q| q.pid == pid && q.start_time == start_time)
            .or_else(|| p.processes.iter().find(|q| q.pid == pid)),
    };
    let program = match (group, process) {
        (Some(program), _) => program,
        (None, Some(q)) if !q.program.is_empty() => q.program.as_str(),
        (None, Some(q)) => q.command.split_whitespace().next().unwrap_or(""),
        (None, None) => "",
    };
    let mut attributes = Vec::new();
    if group.is_none() {
        attributes.push(int_attribute("process.pid", i64::from(pid)));
    }
    let name = basename(program);
    if !program.is_empty() {
        attributes.push(str_attribute("process.executable.path", program));
        attributes.push(str_attribute("process.executable.name", name));
    }
    if let Some(q) = process.filter(|q| group.is_none() && !q.command.is_empty()) {
        attributes.push(str_attribute("process.command_line", &q.command));
    }
    if let Some(q) = process {
        for (key, value) in identity_attributes(q) {
            attributes.push(str_attribute(key, &value));
        }
    }
    if !host.name.is_empty() {
        attributes.push(str_attribute("host.name", &host.name));
    }
    for (key, value) in &host.attributes {
        if !attributes.iter().any(|a| a.key == *key) {
            attributes.push(str_attribute(key, value));
        }
    }
    // What OpenTelemetry SDKs say when no service is named; backends
    // (Pyroscope) group by it.
    let service = match (&host.service_name, name) {
        (Some(service), _) => service.clone(),
        (None, "") => "unknown_service".to_string(),
        (None, name) => format!("unknown_service:{name}"),
    };
    attributes.push(str_attribute("service.name", &service));
    attributes
}

/// What the process's cgroup names (docs/cgroups.md): `container.id`,
/// `k8s.pod.uid`, and its cgroup path, as OTel's semantic conventions name
/// them (values escaped by `str_attribute`).
fn identity_attributes(process: &ProcessInfo) -> Vec<(&'static str, String)> {
    let id = &process.identity;
    [
        ("container.id", &id.container_id),
        ("k8s.pod.uid", &id.pod_uid),
        ("process.cgroup", &id.cgroup),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.clone().map(|v| (key, v)))
    .collect()
}

fn str_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(
                escape::text(value).into_owned(),
            )),
        }),
        ..Default::default()
    }
}

fn int_attribute(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

mod dictionary;
#[cfg(test)]
mod tests;
