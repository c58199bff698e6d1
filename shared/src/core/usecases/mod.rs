//! The action protocol, shared by both backends: plan, execute (with its replay rules),
//! the sweeper, the kill switch, and the read use cases. Everything that decides lives
//! here; the ports only store and check conditions.

pub mod actions;
pub mod approvals;
pub mod control;
pub mod day_pnl;
pub mod execute;
pub mod kill_switch;
pub mod limits;
pub mod plan;
pub mod portfolio;
pub mod reads;
pub mod views;
pub mod worker;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::core::digest::sha256_hex;
use crate::core::domain::PRINTABLE_PATTERN;
use crate::core::error::{ApiError, Code};
use crate::core::parse::{check_ident, check_text};

/// Free-form chat trace fields, kept for audit. Bounds (checked by
/// [`ChatContext::validate`], published by the schema below): the two ids are 1 to
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
    /// Bounds of a body's `chat_context` (kept for audit, so kept clean), as its schema
    /// publishes them: the two ids are 1..256 characters of text
    /// without control characters; at most [`MAX_CHAT_KEYS`] keys in all, trace fields named
    /// like identifiers, each a number, a boolean, `null` or at most [`MAX_TRACE_TEXT`]
    /// characters of text. The worst case stays well inside the 64 KiB body.
    pub fn validate(&self, prefix: &str) -> Result<(), ApiError> {
        for (name, v) in [
            ("chat_session_id", &self.chat_session_id),
            ("tool_call_id", &self.tool_call_id),
        ] {
            if let Some(s) = v {
                check_text(&format!("{prefix}/{name}"), s, 256)?;
            }
        }
        let keys = self.extra.len()
            + usize::from(self.chat_session_id.is_some())
            + usize::from(self.tool_call_id.is_some());
        if keys > MAX_CHAT_KEYS {
            return Err(ApiError::invalid(
                prefix,
                format!("holds more than {MAX_CHAT_KEYS} fields"),
            ));
        }
        for (k, v) in &self.extra {
            let pointer = format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1"));
            match v {
                serde_json::Value::String(s) if s.chars().count() > MAX_TRACE_TEXT => {
                    return Err(ApiError::invalid(
                        pointer,
                        format!("trace text is at most {MAX_TRACE_TEXT} characters"),
                    ))
                }
                serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
                    return Err(ApiError::invalid(
                        pointer,
                        "a trace field is a string, a number, a boolean or null",
                    ))
                }
                _ => {}
            }
            check_ident(&pointer, k).map_err(|_| {
                ApiError::invalid(
                    prefix,
                    "trace field names must be 1 to 64 letters, digits or -_.:",
                )
            })?;
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
    use super::*;

    fn chat(v: serde_json::Value) -> Result<(), ApiError> {
        let c: ChatContext = serde_json::from_value(v).unwrap();
        c.validate("/chat_context")
    }

    fn field(r: Result<(), ApiError>) -> String {
        r.unwrap_err().details[0].field.clone()
    }

    #[test]
    fn chat_context_is_bounded() {
        assert!(chat(
            serde_json::json!({"chat_session_id": "c-1", "tool_call_id": "t", "turn": 3})
        )
        .is_ok());
        assert_eq!(
            field(chat(serde_json::json!({"chat_session_id": "c\n1"}))),
            "/chat_context/chat_session_id"
        );
        assert_eq!(
            field(chat(serde_json::json!({"tool_call_id": "x".repeat(257)}))),
            "/chat_context/tool_call_id"
        );
        assert_eq!(
            field(chat(serde_json::json!({"bad key": 1}))),
            "/chat_context"
        );
        let keys = |n: usize| -> serde_json::Value {
            (0..n)
                .map(|i| (format!("k{i}"), serde_json::json!(i)))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        assert!(chat(keys(MAX_CHAT_KEYS)).is_ok());
        assert_eq!(field(chat(keys(MAX_CHAT_KEYS + 1))), "/chat_context");
        // The two ids count among the keys.
        let mut with_ids = keys(MAX_CHAT_KEYS - 1);
        with_ids["chat_session_id"] = serde_json::json!("c-1");
        assert!(chat(with_ids.clone()).is_ok());
        with_ids["tool_call_id"] = serde_json::json!("t-1");
        assert_eq!(field(chat(with_ids)), "/chat_context");
        // Trace values: flat, and text of at most 128 characters (counted as characters).
        assert!(chat(serde_json::json!({"note": "é".repeat(MAX_TRACE_TEXT)})).is_ok());
        assert_eq!(
            field(chat(
                serde_json::json!({"note": "x".repeat(MAX_TRACE_TEXT + 1)})
            )),
            "/chat_context/note"
        );
        assert_eq!(
            field(chat(serde_json::json!({"trace": {"k": 1}}))),
            "/chat_context/trace"
        );
        assert_eq!(
            field(chat(serde_json::json!({"trace": [1]}))),
            "/chat_context/trace"
        );
        // An id is text or absent, never null (a schema counts a null key).
        assert!(serde_json::from_value::<ChatContext>(
            serde_json::json!({"chat_session_id": null})
        )
        .is_err());
    }

    #[test]
    fn sha256_hex_is_the_lowercase_digest() {
        // FIPS 180-2's vectors.
        assert_eq!(
            crate::core::digest::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
