//! `GET /positions?account_id=`: positions on the operator's desks.

use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, QueryParams};
use crate::protocol::views::ListingView;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/positions"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Response, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let account_id = q.ident("account_id")?;
    let page = q.page()?;
    q.finish()?;
    let l = st
        .reads
        .positions(&caller, account_id.as_deref(), &page)
        .await?;
    Ok(Json(ListingView {
        name: "positions",
        listing: &l,
    })
    .into_response())
}
