//! `POST /actions/plan`: validate, run risk checks, return a preview and a confirmation token.

use axum::extract::State;
use axum::http::Uri;
use axum::routing::post;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, JsonBody, QueryParams};
use crate::http::observe::current_request_id;
use crate::protocol::plan::{self, PlanRequest, PlanResponse};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/actions/plan"), post(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
    JsonBody(req): JsonBody<PlanRequest>,
) -> Result<Json<PlanResponse>, ApiError> {
    QueryParams::parse(uri.query())?.finish()?;
    Ok(Json(
        plan::plan(&st, &caller, req, &current_request_id()).await?,
    ))
}
