//! `GET /accounts`: the accounts on the operator's desks.

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
    Router::new().route(&api("/accounts"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Response, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.accounts(&caller, &page).await?;
    Ok(Json(ListingView {
        name: "accounts",
        listing: &l,
    })
    .into_response())
}
