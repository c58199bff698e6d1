//! `POST /actions/execute`: plan id + confirmation token + idempotency key -> queued work.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{check_ident, Authed, JsonBody, Query};
use crate::http::observe::current_request_id;
use crate::protocol::execute::{ExecuteOutcome, ExecuteRequest, RequestFacts};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/actions/execute"), post(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(q): Query,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecuteRequest>,
) -> Result<Response, ApiError> {
    q.finish()?;
    check_execute_request(&req)?;
    let header_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be printable ASCII"))?,
        ),
    };
    let request_id = current_request_id();
    let facts = RequestFacts {
        request_id: &request_id,
        chat: req.chat_context.clone().unwrap_or_default(),
    };
    Ok(
        match st.execute.execute(&caller, req, header_key, facts).await? {
            ExecuteOutcome::Queued(a) => (StatusCode::ACCEPTED, Json(a)).into_response(),
            ExecuteOutcome::Duplicate(a) => (StatusCode::OK, Json(a)).into_response(),
        },
    )
}

/// Bounds of an execute body that the typed parse does not enforce: the plan id is an
/// identifier and the confirmation token compact-JWS text, so neither reaches a store key
/// or a log malformed. `idempotency_key` is bounded by its type, `requested_by` by the
/// protocol.
pub(crate) fn check_execute_request(req: &ExecuteRequest) -> Result<(), ApiError> {
    check_ident("/plan_id", &req.plan_id)
        .map_err(|_| ApiError::invalid("/plan_id", "must be a plan id from POST /actions/plan"))?;
    if let Some(t) = &req.confirmation_token {
        if t.is_empty()
            || t.len() > 4096
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(ApiError::invalid(
                "/confirmation_token",
                "must be the token from the plan",
            ));
        }
    }
    if let Some(c) = &req.chat_context {
        super::check_chat_context(c, "/chat_context")?;
    }
    Ok(())
}
