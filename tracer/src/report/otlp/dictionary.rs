//! The request's one `ProfilesDictionary`: strings, functions, locations,
//! mappings, stacks and attributes, each entry made once, and the
//! profiles that index into it.

use std::collections::HashMap;
use std::sync::Arc;

use super::super::pprof::LOAD_BIAS;
use super::super::pprof_meta::{frame_build_id, saturating_i64};
use super::super::{Frame, StackReport, NO_STACK, TRUNCATED};
use super::{any_value, pb, sample_value, AnyValue, Header};
use crate::escape;

const PAGE: u64 = 4096;

/// The shared tables, each entry made once; entry 0 of each is its zero
/// value.
pub(super) struct Dictionary<'a> {
    strings: Vec<String>,
    string_ids: HashMap<String, i32>,
    functions: Vec<pb::Function>,
    function_ids: HashMap<(i32, i32), i32>,
    locations: Vec<pb::Location>,
    /// By the frames' identity (`Arc` pointers), as pprof's `Group`.
    location_ids: HashMap<Vec<*const Frame>, i32>,
    special_locations: HashMap<&'static str, i32>,
    mappings: Vec<pb::Mapping>,
    mapping_ids: HashMap<&'a str, i32>,
    stacks: Vec<pb::Stack>,
    stack_ids: HashMap<Vec<i32>, i32>,
    attributes: Vec<pb::KeyValueAndUnit>,
    attribute_ids: HashMap<(i32, String), i32>,
}

impl Default for Dictionary<'_> {
    fn default() -> Self {
        Dictionary {
            strings: vec![String::new()],
            string_ids: HashMap::from([(String::new(), 0)]),
            functions: vec![pb::Function::default()],
            function_ids: HashMap::new(),
            locations: vec![pb::Location::default()],
            location_ids: HashMap::new(),
            special_locations: HashMap::new(),
            mappings: vec![pb::Mapping::default()],
            mapping_ids: HashMap::new(),
            stacks: vec![pb::Stack::default()],
            stack_ids: HashMap::from([(Vec::new(), 0)]),
            attributes: vec![pb::KeyValueAndUnit::default()],
            attribute_ids: HashMap::new(),
        }
    }
}

/// The index the next entry of `table` gets.
fn next_index<T>(table: &[T]) -> i32 {
    i32::try_from(table.len()).unwrap_or(i32::MAX)
}

impl<'a> Dictionary<'a> {
    /// The profile of sample type `i` (`SAMPLE_TYPES`) over one process's
    /// stacks; stacks whose value is 0 have no sample.
    pub(super) fn profile(
        &mut self,
        h: &Header,
        kind: &str,
        unit: &str,
        stacks: &[&'a StackReport],
        i: usize,
    ) -> pb::Profile {
        let samples = stacks
            .iter()
            .filter_map(|s| {
                let value = sample_value(i, &s.counts);
                (value > 0).then(|| pb::Sample {
                    stack_index: self.stack(s),
                    values: vec![saturating_i64(value)],
                    ..Default::default()
                })
            })
            .collect();
        pb::Profile {
            sample_type: Some(self.value_type(kind, unit)),
            samples,
            time_unix_nano: h.time_unix_nano,
            duration_nano: h.duration_nano,
            period_type: Some(self.value_type("space", "bytes")),
            period: h.period,
            ..Default::default()
        }
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> pb::ValueType {
        pb::ValueType {
            type_strindex: self.string(kind),
            unit_strindex: self.string(unit),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = next_index(&self.strings);
        self.strings.push(escape::text(s).into_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    /// The stack of `s`, leaf first, with `[no stack]` for a stack not
    /// captured and `[truncated]` as the root of one cut short.
    fn stack(&mut self, s: &'a StackReport) -> i32 {
        let mut locations: Vec<i32> = Vec::with_capacity(s.frames.len() + 1);
        let mut rest = &s.frames[..];
        while !rest.is_empty() {
            // Inlined frames share the address of the frame they were
            // inlined into, which ends their group.
            let end = rest
                .iter()
                .position(|f| !f.inlined)
                .map_or(rest.len(), |i| i + 1);
            let (group, tail) = rest.split_at(end);
            locations.push(self.location(group));
            rest = tail;
        }
        if s.frames.is_empty() {
            locations.push(self.special_location(NO_STACK));
        }
        if s.truncated {
            locations.push(self.special_location(TRUNCATED));
        }
        if let Some(&id) = self.stack_ids.get(&locations) {
            return id;
        }
        let id = next_index(&self.stacks);
        self.stack_ids.insert(locations.clone(), id);
        self.stacks.push(pb::Stack {
            location_indices: locations,
        });
        id
    }

    fn location(&mut self, group: &'a [Arc<Frame>]) -> i32 {
        let key: Vec<*const Frame> = group.iter().map(Arc::as_ptr).collect();
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let Some(frame) = group.last() else {
            return self.special_location(NO_STACK);
        };
        let mapping_index = self.mapping(frame);
        let lines = group
            .iter()
            .map(|f| pb::Line {
                function_index: self.function(&f.display_name(), f.file.as_deref().unwrap_or("")),
                line: f.line.map_or(0, i64::from),
                column: 0,
            })
            .collect();
        let address = match mapping_index {
            0 => frame.offset,
            _ => frame.offset.saturating_add(LOAD_BIAS),
        };
        let id = next_index(&self.locations);
        self.locations.push(pb::Location {
            mapping_index,
            address,
            lines,
            attribute_indices: Vec::new(),
        });
        self.location_ids.insert(key, id);
        id
    }

    /// A location standing for a frame that was not captured.
    fn special_location(&mut self, name: &'static str) -> i32 {
        if let Some(&id) = self.special_locations.get(name) {
            return id;
        }
        let function_index = self.function(name, "");
        let id = next_index(&self.locations);
        self.locations.push(pb::Location {
            lines: vec![pb::Line {
                function_index,
                ..Default::default()
            }],
            ..Default::default()
        });
        self.special_locations.insert(name, id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> i32 {
        let key = (self.string(name), self.string(file));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = next_index(&self.functions);
        self.functions.push(pb::Function {
            name_strindex: key.0,
            system_name_strindex: key.0,
            filename_strindex: key.1,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }

    /// The mapping of `frame`'s object (0: in no file), widened to hold
    /// its offset; its range is made page-aligned in `finish`.
    fn mapping(&mut self, frame: &'a Frame) -> i32 {
        let Some(module) = frame.object() else {
            return 0;
        };
        let id = match self.mapping_ids.get(module) {
            Some(&id) => id,
            None => {
                let id = next_index(&self.mappings);
                let build_id = frame_build_id(frame, module);
                let attribute_indices = match build_id.as_str() {
                    "" => Vec::new(),
                    id => vec![self.attribute("process.executable.build_id.gnu", id)],
                };
                let filename_strindex = self.string(module);
                self.mappings.push(pb::Mapping {
                    memory_start: frame.offset,
                    memory_limit: frame.offset,
                    file_offset: frame.offset,
                    filename_strindex,
                    attribute_indices,
                });
                self.mapping_ids.insert(module, id);
                id
            }
        };
        if let Some(m) = usize::try_from(id)
            .ok()
            .and_then(|i| self.mappings.get_mut(i))
        {
            m.memory_start = m.memory_start.min(frame.offset);
            m.memory_limit = m.memory_limit.max(frame.offset);
        }
        id
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let key_strindex = self.string(key);
        let map_key = (key_strindex, value.to_owned());
        if let Some(&id) = self.attribute_ids.get(&map_key) {
            return id;
        }
        let id = next_index(&self.attributes);
        self.attributes.push(pb::KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(
                    escape::text(value).into_owned(),
                )),
            }),
            unit_strindex: 0,
        });
        self.attribute_ids.insert(map_key, id);
        id
    }

    pub(super) fn finish(mut self) -> pb::ProfilesDictionary {
        // The file's pages as a process would map them at LOAD_BIAS (see
        // pprof's `Builder::finish`); entry 0 stays the zero mapping.
        for m in self.mappings.iter_mut().skip(1) {
            let (low, high) = (m.memory_start, m.memory_limit);
            m.file_offset = low & !(PAGE - 1);
            m.memory_start = m.file_offset.saturating_add(LOAD_BIAS);
            m.memory_limit = (high | (PAGE - 1))
                .saturating_add(1)
                .saturating_add(LOAD_BIAS);
        }
        pb::ProfilesDictionary {
            mapping_table: self.mappings,
            location_table: self.locations,
            function_table: self.functions,
            // Entry 0: 16 and 8 zero bytes, as the proto prefers.
            link_table: vec![pb::Link {
                trace_id: vec![0; 16],
                span_id: vec![0; 8],
            }],
            string_table: self.strings,
            attribute_table: self.attributes,
            stack_table: self.stacks,
        }
    }
}
