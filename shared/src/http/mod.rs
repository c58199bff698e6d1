//! HTTP plumbing shared by every endpoint: the base path, request ids, the one request
//! log line, body and query parsing, the auth extractor, and (in `error`) the one place
//! errors become HTTP responses. Lambdas and `airlock serve` both wrap their routes with
//! [`app`], so parsing and routing are never written twice.

pub mod error;
pub mod extract;
pub mod observe;

use axum::Router;

use crate::app::AppState;
use crate::error::{ApiError, Code};

pub const BASE_PATH: &str = "/api/internal/v1/mastra";

/// A path under the base path, e.g. `api("/accounts")`.
pub fn api(path: &str) -> String {
    format!("{BASE_PATH}{path}")
}

/// Wraps endpoint routes with the fallbacks, the request-id and logging layer and the state.
pub fn app(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .fallback(|| async {
            ApiError::new(
                Code::NotFound,
                "No such endpoint. Paths live under /api/internal/v1/mastra.",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                Code::MethodNotAllowed,
                "This endpoint does not take that HTTP method.",
            )
        })
        .layer(axum::middleware::from_fn(observe::observe))
        .with_state(state)
}
