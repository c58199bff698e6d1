//! `POST /actions/execute`: plan id + confirmation token + idempotency key -> queued work.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, JsonBody, QueryParams};
use crate::http::observe::current_request_id;
use crate::protocol::execute::{self, ExecuteOutcome, ExecuteRequest, RequestFacts};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/actions/execute"), post(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecuteRequest>,
) -> Result<Response, ApiError> {
    QueryParams::parse(uri.query())?.finish()?;
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
        match execute::execute(&st, &caller, req, header_key, facts).await? {
            ExecuteOutcome::Queued(a) => (StatusCode::ACCEPTED, Json(a)).into_response(),
            ExecuteOutcome::Duplicate(a) => (StatusCode::OK, Json(a)).into_response(),
        },
    )
}
