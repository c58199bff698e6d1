//! `GET /jobs?kind=&status=`: jobs of the operator's desks, newest first.

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::{Authed, Query};
use crate::ports::JobFilter;

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/jobs"), get(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(mut q): Query,
) -> Result<Response, ApiError> {
    let filter = JobFilter {
        kind: q.parsed("kind")?,
        status: q.parsed("status")?,
    };
    let page = q.page()?;
    q.finish()?;
    let l = st.reads.jobs(&caller, filter, &page).await?;
    Ok(super::listing("jobs", &l))
}
