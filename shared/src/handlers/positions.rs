//! `GET /positions?account_id=`: positions on the operator's desks.

use axum::extract::State;
use axum::http::Uri;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

use super::views;
use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, QueryParams};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/positions"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let account_id = q.ident("account_id")?;
    let page = q.page()?;
    q.finish()?;
    let l = st
        .reads
        .positions(&caller, account_id.as_deref(), &page)
        .await?;
    Ok(Json(views::listing("positions", &l, views::position)))
}
