//! `GET /orders?account_id=&status=`: orders on the operator's desks, newest first.

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, Query};
use crate::ports::OrderFilter;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/orders"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let filter = OrderFilter {
        account_id: q.ident("account_id")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.orders(&caller, filter, &page).await?;
    Ok(super::listing("orders", &l))
}
