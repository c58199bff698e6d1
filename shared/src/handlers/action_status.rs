//! `GET /actions/{action_id}`: the status of an executed action, as the workers report it.
//! A malformed id (not percent-decodable, too long, other characters) is 400
//! `invalid_request` naming `action_id`, before any store is asked; an unknown one is 404.
//! `?wait=N` (0 to 20 s) answers as soon as the status changes, or when the wait ends.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use crate::app::AppState;
use crate::domain::Ident;
use crate::error::{ApiError, Code};
use crate::http::api;
use crate::http::extract::{Authed, PathId, Query};
use crate::http::openapi::{schema, Api, Op};
use crate::protocol::views::ActionView;

/// The longest `wait`, seconds: inside API Gateway's 29 s and the function's timeout.
pub const MAX_WAIT_S: u64 = 20;

/// `wait`: a whole number of seconds, 0 to [`MAX_WAIT_S`] (absent: 0).
pub fn wait_seconds(v: Option<&str>) -> Result<u64, ApiError> {
    match v {
        None => Ok(0),
        Some(t) => match t.parse::<u64>() {
            Ok(n) if n <= MAX_WAIT_S && !t.starts_with('+') => Ok(n),
            _ => Err(ApiError::invalid(
                "wait",
                format!("must be a whole number of seconds from 0 to {MAX_WAIT_S}"),
            )),
        },
    }
}

pub fn api_doc() -> Api {
    Api::new().route(
        Op::get(api("/actions/{action_id}"), "getAction")
            .tag("actions")
            .summary(
                "An executed action's status",
                "The status of an executed action as the workers report it (queued, processing, succeeded, failed). With `wait`, answers as soon as the status changes, or when the wait ends.",
            )
            .path_param("action_id", schema::<Ident>, "The `action_id` an execute returned.")
            .query("wait", |_| schemars::json_schema!({"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0}), "Seconds to wait for a change of status, 0 to 20.")
            .errors(&[Code::ActionNotFound])
            .answers(200, "The action.", schema::<ActionView<'static>>),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    PathId(action_id): PathId,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let wait = wait_seconds(q.text("wait")?.as_deref())?;
    q.finish()?;
    let a = st
        .reads
        .action_wait(&caller, &action_id, std::time::Duration::from_secs(wait))
        .await?;
    Ok(Json(ActionView::from(&a)).into_response())
}
