//! `GET /orders?account_id=&status=`: orders on the operator's desks, newest first.

use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, QueryParams};
use crate::ports::OrderFilter;
use crate::protocol::views::ListingView;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/orders"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Response, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let filter = OrderFilter {
        account_id: q.ident("account_id")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.orders(&caller, filter, &page).await?;
    Ok(Json(ListingView {
        name: "orders",
        listing: &l,
    })
    .into_response())
}
