//! The action protocol, shared by both backends: plan, execute (with its replay rules),
//! the sweeper, the kill switch, and the read use cases. Everything that decides lives
//! here; the ports only store and check conditions.

pub mod approvals;
pub mod control;
pub mod execute;
pub mod limits;
pub mod plan;
pub mod portfolio;
pub mod reads;
pub mod tools;
pub mod views;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, Code};

/// Free-form chat trace fields, kept for audit. Bounds (checked by
/// `handlers::check_chat_context`, published by the schema below): the two ids are 1 to
/// 256 characters without control characters; at most [`MAX_TRACE_FIELDS`] more fields,
/// named like identifiers, each a number, a boolean, `null` or a string of at most
/// [`MAX_TRACE_TEXT`] characters; at most [`MAX_CHAT_KEYS`] keys in all. The ids are text
/// or absent, never `null`, so the count of keys is the count a schema sees.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatContext {
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_text"
    )]
    pub chat_session_id: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_text"
    )]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A text field that may be absent but not `null`.
fn some_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// The most keys a `chat_context` may hold, its two ids included.
pub const MAX_CHAT_KEYS: usize = 18;
/// The longest string a trace field may hold, in characters.
pub const MAX_TRACE_TEXT: usize = 128;
/// Text a person or a log will read: no control characters (as JSON Schema, Unicode Cc).
pub const PRINTABLE_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";

impl schemars::JsonSchema for ChatContext {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ChatContext".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let id = serde_json::json!({"type": "string", "minLength": 1, "maxLength": 256, "pattern": PRINTABLE_PATTERN});
        schemars::json_schema!({
            "type": "object",
            "description": "Where in the chat the request came from, kept with the plan and in audit records: the chat session, the tool call, and up to 16 flat trace fields of your own.",
            "properties": {"chat_session_id": id, "tool_call_id": id},
            "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": "^[A-Za-z0-9._:-]+$"},
            "additionalProperties": {"anyOf": [
                {"type": "string", "maxLength": MAX_TRACE_TEXT},
                {"type": ["number", "boolean", "null"]}
            ]},
            "maxProperties": MAX_CHAT_KEYS
        })
    }
}

impl ChatContext {
    pub fn validate(&self, prefix: &str) -> Result<(), ApiError> {
        for (name, v) in [
            ("chat_session_id", &self.chat_session_id),
            ("tool_call_id", &self.tool_call_id),
        ] {
            if let Some(s) = v {
                if s.is_empty() || s.chars().count() > 256 {
                    return Err(ApiError::invalid(
                        format!("{prefix}/{name}"),
                        "must be 1 to 256 characters",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Who the request was made for, as sent in a body: 1..256 printable characters.
pub fn parse_requested_by(s: &str) -> Result<(), ApiError> {
    if s.is_empty() || s.chars().count() > 256 || s.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid(
            "/requested_by",
            "must be the operator id, 1 to 256 printable characters",
        ));
    }
    Ok(())
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    // Written digit by digit: a `format!` per byte would be most of this function's time
    // (about 1 % of the server's CPU under `pairs`, several hashes per plan).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for b in Sha256::digest(bytes) {
        hex.push(DIGITS[usize::from(b >> 4)] as char);
        hex.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    hex
}

/// SHA-256 of the canonical JSON of a value: object keys sorted, no white space.
pub fn payload_hash(v: &serde_json::Value) -> String {
    // serde_json's Map is a BTreeMap here (no `preserve_order`), so keys print sorted.
    sha256_hex(v.to_string().as_bytes())
}

pub(crate) fn not_found(code: Code, what: &str, id: &str) -> ApiError {
    ApiError::new(code, format!("No {what} {id} is visible to this operator."))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_hex_is_the_lowercase_digest() {
        // FIPS 180-2's vectors.
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
