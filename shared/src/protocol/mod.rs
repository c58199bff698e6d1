//! The action protocol, shared by both backends: plan, execute (with its replay rules),
//! the sweeper, the kill switch, and the read use cases. Everything that decides lives
//! here; the ports only store and check conditions.

pub mod approvals;
pub mod control;
pub mod execute;
pub mod plan;
pub mod reads;
pub mod tools;
pub mod views;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{ApiError, Code};

/// Free-form chat trace fields, kept for audit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChatContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl ChatContext {
    pub fn validate(&self, prefix: &str) -> Result<(), ApiError> {
        for (name, v) in [
            ("chat_session_id", &self.chat_session_id),
            ("tool_call_id", &self.tool_call_id),
        ] {
            if let Some(s) = v {
                if s.is_empty() || s.len() > 256 {
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
    if s.is_empty() || s.len() > 256 || s.chars().any(|c| c.is_control()) {
        return Err(ApiError::invalid(
            "/requested_by",
            "must be the operator id, 1 to 256 printable characters",
        ));
    }
    Ok(())
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the canonical JSON of a value: object keys sorted, no white space.
pub fn payload_hash(v: &serde_json::Value) -> String {
    // serde_json's Map is a BTreeMap here (no `preserve_order`), so keys print sorted.
    sha256_hex(v.to_string().as_bytes())
}

pub(crate) fn not_found(code: Code, what: &str, id: &str) -> ApiError {
    ApiError::new(code, format!("No {what} {id} is visible to this operator."))
}
