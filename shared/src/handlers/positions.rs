//! `GET /positions?account_id=`: positions on the operator's desks.

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, Query};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/positions"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let account_id = q.ident("account_id")?;
    let page = q.page()?;
    q.finish()?;
    let l = st
        .reads
        .positions(&caller, account_id.as_deref(), &page)
        .await?;
    Ok(super::listing("positions", &l))
}
