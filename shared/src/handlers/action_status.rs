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

/// The wall clock, in milliseconds since the epoch: the clock of a Lambda's deadline.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// On Lambda, when the invocation must have answered (`lambda_http` leaves the runtime's
/// context in the request's extensions): milliseconds since the epoch.
pub fn lambda_deadline_ms(extensions: &axum::http::Extensions) -> Option<u64> {
    extensions
        .get::<lambda_http::Context>()
        .map(|c| c.deadline)
        .filter(|d| *d > 0)
}

/// How long a wait may last: `wait`, cut on Lambda so that it ends `reserve` before the
/// invocation's deadline (what comes after it then fits before the function times out).
/// Zero: no time to wait.
pub fn within_deadline(
    wait: Duration,
    deadline_ms: Option<u64>,
    now_ms: u64,
    reserve: Duration,
) -> Duration {
    match deadline_ms {
        None => wait,
        Some(d) => {
            wait.min(Duration::from_millis(d.saturating_sub(now_ms)).saturating_sub(reserve))
        }
    }
}

/// What a `wait` keeps of its invocation: its first read (before the wait starts) and its
/// last, each bounded by the operation timeout.
pub fn wait_reserve(operation_timeout_ms: u64) -> Duration {
    Duration::from_millis(2 * operation_timeout_ms)
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

#[cfg(test)]
mod deadline_tests {
    use super::*;

    #[test]
    fn a_wait_ends_in_time_for_the_lambda_to_answer() {
        let s = Duration::from_secs;
        let reserve = wait_reserve(2_000);
        assert_eq!(reserve, s(4));
        // Outside Lambda: the wait asked for.
        assert_eq!(within_deadline(s(20), None, 1_000, reserve), s(20));
        // 10 s left: the wait ends 4 s before the deadline.
        assert_eq!(within_deadline(s(20), Some(11_000), 1_000, reserve), s(6));
        assert_eq!(within_deadline(s(5), Some(28_000), 1_000, reserve), s(5));
        // Less left than the reserve, or a deadline already past: no wait.
        assert_eq!(within_deadline(s(20), Some(4_000), 1_000, reserve), s(0));
        assert_eq!(within_deadline(s(20), Some(500), 1_000, reserve), s(0));
    }
}
