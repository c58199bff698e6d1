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
pub mod metrics;
pub mod openapi;
pub mod orders;
pub mod plan;
pub mod portfolio;
pub mod positions;

use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::extract::{check_ident, check_text};
use crate::http::openapi::Api;
use crate::protocol::{ChatContext, MAX_CHAT_KEYS, MAX_TRACE_TEXT};

/// Every endpoint and its documentation: what `airlock serve` mounts, and the OpenAPI
/// document (`openapi::text`).
pub fn all_api() -> Api {
    Api::new()
        .merge(health::api_doc())
        .merge(openapi::api_doc())
        .merge(accounts::api_doc())
        .merge(positions::api_doc())
        .merge(portfolio::api_doc())
        .merge(orders::api_doc())
        .merge(jobs::api_doc())
        .merge(action_status::api_doc())
        .merge(plan::api_doc())
        .merge(execute::api_doc())
        .merge(approvals::api_doc())
        .merge(mcp::api_doc(true))
}

/// Every endpoint on one router: what `airlock serve` mounts.
pub fn all() -> Router<AppState> {
    all_api().into_router()
}

/// One page of a listing as the answer: `{ "<name>": [...], "next_cursor": ... }`.
fn listing<T>(name: &'static str, listing: &crate::protocol::reads::Listing<T>) -> Response
where
    for<'a> T: crate::protocol::views::Viewed<'a>,
    for<'a> &'a T: Into<<T as crate::protocol::views::Viewed<'a>>::View>,
{
    // Sized for the page up front (an order's view is about 330 bytes): written into a
    // growing buffer, a 50-row page would be copied about eight times on its way to 16 KB.
    let mut body = Vec::with_capacity(64 + 384 * listing.rows.len());
    match serde_json::to_writer(
        &mut body,
        &crate::protocol::views::ListingView { name, listing },
    ) {
        Ok(()) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => ApiError::internal(format!("writing the page: {e}")).into_response(),
    }
}

/// Bounds of a body's `chat_context` (kept for audit, so kept clean), as its schema
/// (`protocol::ChatContext`) publishes them: the two ids are 1..256 characters of text
/// without control characters; at most [`MAX_CHAT_KEYS`] keys in all, trace fields named
/// like identifiers, each a number, a boolean, `null` or at most [`MAX_TRACE_TEXT`]
/// characters of text. The worst case stays well inside the 64 KiB body.
pub(crate) fn check_chat_context(c: &ChatContext, prefix: &str) -> Result<(), ApiError> {
    for (name, v) in [
        ("chat_session_id", &c.chat_session_id),
        ("tool_call_id", &c.tool_call_id),
    ] {
        if let Some(s) = v {
            check_text(&format!("{prefix}/{name}"), s, 256)?;
        }
    }
    let keys = c.extra.len()
        + usize::from(c.chat_session_id.is_some())
        + usize::from(c.tool_call_id.is_some());
    if keys > MAX_CHAT_KEYS {
        return Err(ApiError::invalid(
            prefix,
            format!("holds more than {MAX_CHAT_KEYS} fields"),
        ));
    }
    for (k, v) in &c.extra {
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
}
