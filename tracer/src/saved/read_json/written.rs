//! The document as `--format json` writes it (report/json.rs): the
//! profile's fields, read by the profile types' own `Deserialize`, with
//! two keys of the document's own taken out on the way: `format`, and the
//! `frames` table the stacks' lists of frames index.

use std::{fmt, sync::Arc};

use serde::de::{
    value::MapAccessDeserializer, DeserializeSeed, Error as _, IntoDeserializer as _, MapAccess,
    SeqAccess, Visitor,
};
use serde::{Deserialize, Deserializer};

use crate::profile::{Frame, ProfileOf};

/// A saved document: its version, its profile with each list of frames as
/// written, and its table of frames.
pub(super) struct Written {
    pub(super) format: Option<String>,
    pub(super) profile: ProfileOf<WrittenFrames>,
    /// Empty in version 1, which has none.
    pub(super) table: Vec<Arc<Frame>>,
}

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Written, D::Error> {
        d.deserialize_map(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Written;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a memtrace-bpf profile (a JSON object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Written, A::Error> {
        let mut format = None;
        let mut table = Vec::new();
        let rest = DocumentKeys {
            map,
            format: &mut format,
            table: &mut table,
        };
        let profile = ProfileOf::deserialize(MapAccessDeserializer::new(rest))?;
        Ok(Written {
            format,
            profile,
            table,
        })
    }
}

/// The top-level map as the profile's: `format` and `frames` are read
/// into the document's fields as they pass, every other key goes on to
/// the profile (which ignores keys it does not have, such as `groups`,
/// derived from the rest). Streamed: nothing is buffered.
struct DocumentKeys<'a, A> {
    map: A,
    format: &'a mut Option<String>,
    table: &'a mut Vec<Arc<Frame>>,
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for DocumentKeys<'_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        while let Some(key) = self.map.next_key::<String>()? {
            match key.as_str() {
                "format" => *self.format = self.map.next_value()?,
                "frames" => *self.table = self.map.next_value()?,
                _ => return seed.deserialize(key.into_deserializer()).map(Some),
            }
        }
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.map.next_value_seed(seed)
    }
}

/// A list of frames as a saved file holds it: indices into the document's
/// `frames` table (version 2), or the frames themselves (version 1).
#[derive(Debug)]
pub(super) enum WrittenFrames {
    Indices(Vec<u32>),
    InPlace(Vec<Frame>),
}

impl Default for WrittenFrames {
    fn default() -> WrittenFrames {
        WrittenFrames::Indices(Vec::new())
    }
}

impl WrittenFrames {
    pub(super) fn len(&self) -> usize {
        match self {
            WrittenFrames::Indices(v) => v.len(),
            WrittenFrames::InPlace(v) => v.len(),
        }
    }
}

impl<'de> Deserialize<'de> for WrittenFrames {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WrittenFrames, D::Error> {
        d.deserialize_seq(ListVisitor)
    }
}

struct ListVisitor;

impl<'de> Visitor<'de> for ListVisitor {
    type Value = WrittenFrames;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of frame indices or of frames")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WrittenFrames, A::Error> {
        let mut indices = Vec::new();
        let mut in_place = Vec::new();
        while let Some(r) = seq.next_element::<Ref>()? {
            match r {
                Ref::Index(i) => indices.push(i),
                Ref::Frame(f) => in_place.push(f),
            }
            if !indices.is_empty() && !in_place.is_empty() {
                return Err(A::Error::custom(
                    "a list of frames mixes indices and frames",
                ));
            }
        }
        Ok(if in_place.is_empty() {
            WrittenFrames::Indices(indices)
        } else {
            WrittenFrames::InPlace(in_place)
        })
    }
}

/// One element of a list of frames: told apart by its JSON type, without
/// buffering (`deserialize_any`).
enum Ref {
    Index(u32),
    Frame(Frame),
}

impl<'de> Deserialize<'de> for Ref {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ref, D::Error> {
        d.deserialize_any(RefVisitor)
    }
}

struct RefVisitor;

impl<'de> Visitor<'de> for RefVisitor {
    type Value = Ref;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a frame index or a frame")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Ref, E> {
        // A table of 2^32 frames would take over 300 GiB of names.
        u32::try_from(v)
            .map(Ref::Index)
            .map_err(|_| E::custom(format!("frame index {v} is out of range")))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Ref, A::Error> {
        Frame::deserialize(MapAccessDeserializer::new(map)).map(Ref::Frame)
    }
}
