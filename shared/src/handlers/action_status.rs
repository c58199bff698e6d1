//! `GET /actions/{action_id}`: the status of an executed action, as the workers report it.
//! A malformed id (not percent-decodable, too long, other characters) is 400
//! `invalid_request` naming `action_id`, before any store is asked; an unknown one is 404.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, PathId, Query};
use crate::protocol::views::ActionView;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/actions/{action_id}"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    PathId(action_id): PathId,
    Query(q): Query,
) -> Result<Response, ApiError> {
    q.finish()?;
    let a = st.reads.action(&caller, &action_id).await?;
    Ok(Json(ActionView::from(&a)).into_response())
}
