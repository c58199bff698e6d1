//! One handler per endpoint, each in its own module with a `routes()` that a Lambda's
//! `main` mounts alone and `airlock serve` merges with the others (see [`all`]).
//! A handler parses HTTP, calls the protocol, and shapes the JSON answer.

pub mod accounts;
pub mod action_status;
pub mod approval_pages;
pub mod approvals;
pub mod execute;
pub mod health;
pub mod jobs;
pub mod mcp;
pub mod orders;
pub mod plan;
pub mod positions;

use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::extract::{check_ident, check_text};
use crate::protocol::ChatContext;

/// Every endpoint on one router: what `airlock serve` mounts.
pub fn all() -> Router<AppState> {
    Router::new()
        .merge(health::routes())
        .merge(accounts::routes())
        .merge(positions::routes())
        .merge(orders::routes())
        .merge(jobs::routes())
        .merge(action_status::routes())
        .merge(plan::routes())
        .merge(execute::routes())
        .merge(approvals::routes())
        .merge(mcp::routes(true))
}

/// One page of a listing as the answer: `{ "<name>": [...], "next_cursor": ... }`.
fn listing<T>(name: &'static str, listing: &crate::protocol::reads::Listing<T>) -> Response
where
    for<'a> T: crate::protocol::views::Viewed<'a>,
    for<'a> &'a T: Into<<T as crate::protocol::views::Viewed<'a>>::View>,
{
    Json(crate::protocol::views::ListingView { name, listing }).into_response()
}

/// The most free-form trace fields a `chat_context` may carry next to its two ids.
pub const MAX_CHAT_FIELDS: usize = 32;
/// The most a `chat_context` may weigh, as JSON text (it is kept with the plan).
pub const MAX_CHAT_BYTES: usize = 8 * 1024;

/// Bounds of a body's `chat_context` (kept for audit, so kept clean): the two ids are
/// 1..256 bytes of text without control characters; trace fields are at most
/// [`MAX_CHAT_FIELDS`], named like identifiers, and the whole is at most
/// [`MAX_CHAT_BYTES`] of JSON. Every string in a body is also bounded by the JSON check
/// (`http::extract`).
pub(crate) fn check_chat_context(c: &ChatContext, prefix: &str) -> Result<(), ApiError> {
    for (name, v) in [
        ("chat_session_id", &c.chat_session_id),
        ("tool_call_id", &c.tool_call_id),
    ] {
        if let Some(s) = v {
            check_text(&format!("{prefix}/{name}"), s, 256)?;
        }
    }
    if c.extra.len() > MAX_CHAT_FIELDS {
        return Err(ApiError::invalid(
            prefix,
            format!("holds more than {MAX_CHAT_FIELDS} trace fields"),
        ));
    }
    for k in c.extra.keys() {
        check_ident(
            &format!("{prefix}/{}", k.replace('~', "~0").replace('/', "~1")),
            k,
        )
        .map_err(|_| {
            ApiError::invalid(
                prefix,
                "trace field names must be 1 to 64 letters, digits or -_.:",
            )
        })?;
    }
    let size = serde_json::to_vec(c).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_CHAT_BYTES {
        return Err(ApiError::invalid(
            prefix,
            format!("is larger than {MAX_CHAT_BYTES} bytes of JSON"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(v: serde_json::Value) -> Result<(), ApiError> {
        let c: ChatContext = serde_json::from_value(v).unwrap();
        check_chat_context(&c, "/chat_context")
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
        let many: serde_json::Map<String, serde_json::Value> = (0..33)
            .map(|i| (format!("k{i}"), serde_json::json!(i)))
            .collect();
        assert_eq!(
            field(chat(serde_json::Value::Object(many))),
            "/chat_context"
        );
        let big: serde_json::Map<String, serde_json::Value> = (0..3)
            .map(|i| (format!("k{i}"), serde_json::json!("x".repeat(3000))))
            .collect();
        assert_eq!(field(chat(serde_json::Value::Object(big))), "/chat_context");
    }
}
