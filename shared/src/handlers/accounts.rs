//! `GET /accounts`: the accounts on the operator's desks.

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
    Router::new().route(&api("/accounts"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Json<Value>, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.accounts(&caller, &page).await?;
    Ok(Json(views::listing("accounts", &l, views::account)))
}
