//! `GET /metrics`: this process's metrics in the Prometheus text format, for `airlock
//! serve` (and `airlock stats`). Outside the base path and the OpenAPI document: it is for
//! the operator's scraper, not the agent, and carries no tokens, so `airlock serve` offers
//! it only on a loopback address (its own listener when that is loopback, or
//! `--metrics-addr`). On Lambda the same metrics go to CloudWatch as EMF instead.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::AppState;
use crate::core::error::ApiError;

pub const PATH: &str = "/metrics";

pub fn routes() -> Router<AppState> {
    Router::new().route(PATH, get(handler))
}

async fn handler(State(st): State<AppState>) -> Result<Response, ApiError> {
    // State, not events: the queues and the kill switch as they are now.
    crate::metrics::observe_state(
        st.ports.queue.as_ref(),
        st.ports.control.as_ref(),
        st.clock.now_ms(),
    )
    .await?;
    Ok((
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        crate::metrics::registry().prometheus(),
    )
        .into_response())
}
