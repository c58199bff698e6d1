//! How the growing tables keep their JSON bodies: plans, actions, audit records,
//! idempotency keys, check sets and queue messages. Each body is stored as a BLOB, LZ4
//! compressed against a fixed dictionary of typical bodies (`body-dict-1.txt`, built into
//! the binary): a body shares its field names, enum values and check reasons with the
//! dictionary, so about 6 KB of JSON per plan and execute stores in about 1.7 KB.
//! Compression and decompression take a few microseconds per body: bodies are packed by
//! the encoder in `lz4.rs`, which hashes the dictionary once per process, and read
//! by `lz4_flex`.
//!
//! The format is `[1][uncompressed length, u32 little-endian][LZ4 block]`. The first byte
//! names the dictionary: the dictionary file must never change once released; a better one
//! is added as format 2 and format 1 stays readable. Bodies stored as TEXT (databases from
//! before this format, and the small tables that keep text: control, rate limits, the
//! approval documents, the paper book) read as they are.
//!
//! `airlock audit`, `airlock dlq` and the other commands print bodies in full; [`text`] is
//! public for tools and tests that read the database file directly.

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ValueRef};

/// The dictionary of format 1. Never edit it: every body stored in format 1 needs it
/// byte for byte (a unit test holds its hash).
const DICT_1: &[u8] = include_bytes!("body-dict-1.txt");
const FORMAT_1: u8 = 1;
/// [`DICT_1`]'s LZ4 hash table, built once.
static TABLE_1: std::sync::LazyLock<super::lz4::DictTable> =
    std::sync::LazyLock::new(|| super::lz4::DictTable::new(DICT_1));
/// No body the adapter writes comes near this; a larger length means a damaged row.
const MAX_BODY: usize = 16 << 20;

/// A JSON body as stored.
pub(super) fn pack(json: &str) -> Vec<u8> {
    // The encoder of our own reuses the dictionary's table; a body too long for it (none
    // the adapter writes) goes to lz4_flex, which writes the same format.
    let block = TABLE_1
        .compress(json.as_bytes())
        .unwrap_or_else(|| lz4_flex::block::compress_with_dict(json.as_bytes(), DICT_1));
    let mut out = Vec::with_capacity(5 + block.len());
    out.push(FORMAT_1);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&block);
    out
}

/// `value`'s JSON as stored.
pub(super) fn packed_json<T: serde::Serialize + ?Sized>(
    value: &T,
) -> Result<Vec<u8>, crate::core::error::StoreError> {
    serde_json::to_string(value)
        .map(|json| pack(&json))
        .map_err(super::json_err)
}

/// The JSON text of a stored body, packed or text.
pub fn text(v: ValueRef<'_>) -> Result<String, String> {
    match v {
        ValueRef::Text(t) => String::from_utf8(t.to_vec()).map_err(|e| e.to_string()),
        ValueRef::Blob(b) => unpack(b),
        other => Err(format!(
            "a body is TEXT or BLOB, not {:?}",
            other.data_type()
        )),
    }
}

fn unpack(b: &[u8]) -> Result<String, String> {
    let (&format, rest) = b.split_first().ok_or("an empty body")?;
    if format != FORMAT_1 {
        return Err(format!("body format {format} is unknown to this version"));
    }
    let (len, block) = rest
        .split_first_chunk::<4>()
        .ok_or("a body cut before its length")?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_BODY {
        return Err(format!("a body claims {len} bytes"));
    }
    let mut out = vec![0u8; len];
    let n = lz4_flex::block::decompress_into_with_dict(block, &mut out, DICT_1)
        .map_err(|e| format!("a damaged body: {e}"))?;
    if n != len {
        return Err(format!("a damaged body: {n} bytes of {len}"));
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// A body column read as its JSON text: `row.get::<_, Body>(i)?.0`.
pub(super) struct Body(pub String);

impl FromSql for Body {
    fn column_result(v: ValueRef<'_>) -> FromSqlResult<Self> {
        text(v).map(Body).map_err(|e| FromSqlError::Other(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_1_dictionary_never_changes() {
        // Every body stored in format 1 needs this exact dictionary to be read back. To
        // improve the dictionary, add format 2 beside it; never edit this one.
        assert_eq!(
            crate::core::digest::sha256_hex(DICT_1),
            "af5ffd3248e5d6dce5f6710bd966c62a2f98d746d0a983ec6bcf4fcf79e3d5fe",
            "body-dict-1.txt changed: bodies stored with it would no longer read"
        );
    }

    #[test]
    fn bodies_round_trip_and_shrink() {
        let plan = r#"{"account_id":"ACC-2","action_type":"order.submit.cl","status":"planned","preview":"Buy 4 CLZ27 at 70.05 limit on ACC-2, day order.","ünïcode":"✓"}"#;
        let packed = pack(plan);
        assert_eq!(packed[0], FORMAT_1);
        assert!(packed.len() < plan.len() / 2, "{} bytes", packed.len());
        assert_eq!(text(ValueRef::Blob(&packed)).unwrap(), plan);
        assert_eq!(text(ValueRef::Text(plan.as_bytes())).unwrap(), plan);
        assert_eq!(text(ValueRef::Blob(&pack(""))).unwrap(), "");
    }

    #[test]
    fn a_damaged_body_is_an_error_not_a_panic() {
        let good = pack(r#"{"plan_id":"pln_1","status":"planned"}"#);
        let mut longer = good.clone();
        longer[1..5].copy_from_slice(&(u32::MAX).to_le_bytes());
        let mut shorter = good.clone();
        shorter[1..5].copy_from_slice(&3u32.to_le_bytes());
        let mut unknown = good.clone();
        unknown[0] = 9;
        for bad in [
            &[][..],
            &[FORMAT_1, 1, 0][..],
            &good[..good.len() - 2],
            &longer,
            &shorter,
            &unknown,
        ] {
            assert!(text(ValueRef::Blob(bad)).is_err(), "{bad:?}");
        }
        assert!(text(ValueRef::Integer(4)).is_err());
    }
}
