//! `GET /actions/{action_id}`: the status of an executed action, as the workers report it.
//! A malformed id (not percent-decodable, too long, other characters) is 400
//! `invalid_request` naming `action_id`, before any store is asked; an unknown one is 404.
//! `?wait=N` (0 to 20 s) answers as soon as the status changes, or when the wait ends; on
//! Lambda the wait also ends in time for the answer to beat the invocation's deadline.

use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};

use crate::app::AppState;
use crate::core::domain::Ident;
use crate::core::error::{ApiError, Code};
use crate::core::usecases::reads::{wait_seconds, MAX_WAIT_S};
use crate::core::usecases::views::ActionView;
use crate::doors::http::api;
use crate::doors::http::deadline::{lambda_deadline_ms, wait_reserve, wall_ms, within_deadline};
use crate::doors::http::extract::{Authed, PathId, Query};
use crate::doors::http::openapi::{schema, Api, Op};

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
    extensions: axum::http::Extensions,
) -> Result<Response, ApiError> {
    let wait = wait_seconds(q.text("wait")?.as_deref())?;
    q.finish()?;
    let wait = within_deadline(
        Duration::from_secs(wait),
        lambda_deadline_ms(&extensions),
        wall_ms(),
        wait_reserve(st.config.aws.operation_timeout_ms),
    );
    let a = st.reads.action_wait(&caller, &action_id, wait).await?;
    Ok(Json(ActionView::from(&a)).into_response())
}
