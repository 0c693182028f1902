//! What decoding a pprof protobuf will allocate, found before decoding it.
//!
//! prost allocates per element of a repeated field: a 2-byte empty
//! `Sample` becomes a 72-byte struct, each 1-byte packed location id 8
//! bytes. So 128 MiB of input could decode into gigabytes. This walks the
//! wire format (varints and lengths only, nothing allocated) and adds up
//! the structs each repeated field will hold, and the values they become
//! in the profile read from them (one `StackReport` per sample).

use std::mem::size_of;

use anyhow::{bail, Context as _};

use crate::report::{proto, Frame, StackReport};

/// A message whose repeated fields cost memory.
#[derive(Clone, Copy)]
enum Msg {
    Profile,
    Sample,
    Location,
}

/// Bytes that decoding `buf` as a `perftools.profiles.Profile`, and the
/// profile's fixed-size values made from it, take (an upper bound; the
/// names frames copy are counted as they are read).
pub fn decoded_size(buf: &[u8]) -> anyhow::Result<usize> {
    let mut total = 0usize;
    walk(buf, Msg::Profile, &mut total)
        .context("its protobuf is malformed (not a pprof profile)")?;
    Ok(total)
}

fn walk(mut buf: &[u8], msg: Msg, total: &mut usize) -> anyhow::Result<()> {
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let field = key >> 3;
        let cost = match key & 7 {
            0 => {
                varint(&mut buf)?;
                scalar_cost(msg, field)
            }
            1 => {
                take(&mut buf, 8)?;
                0
            }
            2 => {
                let len = usize::try_from(varint(&mut buf)?).unwrap_or(usize::MAX);
                let body = take(&mut buf, len)?;
                bytes_cost(msg, field, body, total)?
            }
            5 => {
                take(&mut buf, 4)?;
                0
            }
            wire => bail!("wire type {wire} (field {field}) is not one a pprof profile uses"),
        };
        *total = total.saturating_add(cost);
    }
    Ok(())
}

/// A repeated integer written unpacked, one element.
fn scalar_cost(msg: Msg, field: u64) -> usize {
    match (msg, field) {
        // comment; location_id, value.
        (Msg::Profile, 13) | (Msg::Sample, 1 | 2) => size_of::<u64>(),
        _ => 0,
    }
}

/// A length-delimited field: a message (walked), a string, or packed
/// integers.
fn bytes_cost(msg: Msg, field: u64, body: &[u8], total: &mut usize) -> anyhow::Result<usize> {
    Ok(match (msg, field) {
        (Msg::Profile, 1) => size_of::<proto::ValueType>() + size_of::<Option<usize>>(),
        (Msg::Profile, 2) => {
            walk(body, Msg::Sample, total)?;
            size_of::<proto::Sample>() + size_of::<StackReport>()
        }
        (Msg::Profile, 3) => size_of::<proto::Mapping>() + 2 * size_of::<usize>(),
        (Msg::Profile, 4) => {
            walk(body, Msg::Location, total)?;
            // And its entry in the id → frames map.
            size_of::<proto::Location>() + 4 * size_of::<usize>()
        }
        // And its entry in the id → (name, file) map.
        (Msg::Profile, 5) => size_of::<proto::Function>() + 64,
        (Msg::Profile, 6) => size_of::<String>() + body.len(),
        (Msg::Profile, 13) | (Msg::Sample, 1 | 2) => packed_count(body) * size_of::<u64>(),
        (Msg::Sample, 3) => size_of::<proto::Label>(),
        // A line becomes a frame (names counted when they are copied).
        (Msg::Location, 4) => {
            size_of::<proto::Line>() + size_of::<Frame>() + 3 * size_of::<usize>()
        }
        _ => 0,
    })
}

/// Varints in a packed field: each ends with a byte below 0x80.
fn packed_count(body: &[u8]) -> usize {
    body.iter().filter(|&&b| b < 0x80).count()
}

fn varint(buf: &mut &[u8]) -> anyhow::Result<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().context("it ends inside a number")?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    bail!("a number is longer than 10 bytes")
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
    if n > buf.len() {
        bail!(
            "a field of {n} bytes runs past the end ({} left)",
            buf.len()
        );
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    #[test]
    fn empty_samples_cost_their_structs_not_their_bytes() {
        let pb = proto::Profile {
            sample: vec![proto::Sample::default(); 1000],
            ..Default::default()
        };
        let bytes = pb.encode_to_vec();
        assert_eq!(bytes.len(), 2000);
        let size = decoded_size(&bytes).expect("scan");
        assert_eq!(
            size,
            1000 * (size_of::<proto::Sample>() + size_of::<StackReport>())
        );
    }

    #[test]
    fn packed_ids_cost_eight_bytes_each_and_garbage_is_malformed() {
        let pb = proto::Profile {
            sample: vec![proto::Sample {
                location_id: vec![1, 300, 1 << 40],
                ..Default::default()
            }],
            ..Default::default()
        };
        let size = decoded_size(&pb.encode_to_vec()).expect("scan");
        assert_eq!(
            size,
            3 * 8 + size_of::<proto::Sample>() + size_of::<StackReport>()
        );
        for bad in [&b"\x12\x05ab"[..], b"\xff\xff\xff", b"\x0b"] {
            let err = format!("{:#}", decoded_size(bad).expect_err("malformed"));
            assert!(err.contains("malformed"), "{err}");
        }
    }
}
