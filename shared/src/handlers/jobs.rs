//! `GET /jobs?kind=&status=`: jobs of the operator's desks, newest first.

use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, QueryParams};
use crate::ports::JobFilter;
use crate::protocol::views::ListingView;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/jobs"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    uri: Uri,
) -> Result<Response, ApiError> {
    let mut q = QueryParams::parse(uri.query())?;
    let filter = JobFilter {
        kind: q.parsed("kind")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.jobs(&caller, filter, &page).await?;
    Ok(Json(ListingView {
        name: "jobs",
        listing: &l,
    })
    .into_response())
}
