//! `GET /accounts`: the accounts on the operator's desks.

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, Query};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/accounts"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.accounts(&caller, &page).await?;
    Ok(super::listing("accounts", &l))
}
