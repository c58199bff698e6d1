//! HTTP plumbing shared by every endpoint: the base path, request ids, the one request
//! log line, body and query parsing, the auth extractor, and (in `error`) the one place
//! errors become HTTP responses. Lambdas and `airlock serve` both wrap their routes with
//! [`app`], so parsing and routing are never written twice.

pub mod deadline;
pub mod error;
pub mod extract;
pub mod observe;
pub mod openapi;
pub mod routes;
pub mod serve;

use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::app::AppState;
use crate::core::error::{ApiError, Code};

pub const BASE_PATH: &str = "/api/internal/v1/mastra";

/// A path under the base path, e.g. `api("/accounts")`.
pub fn api(path: &str) -> String {
    format!("{BASE_PATH}{path}")
}

/// The start of an HTTP Lambda: the JSON log, the metrics of `bin`, and the app from the
/// environment, built once per cold start.
pub async fn lambda_state(bin: &'static str) -> Result<AppState, lambda_http::Error> {
    crate::telemetry::init();
    crate::metrics::init_lambda(bin);
    Ok(crate::app::from_env().await?)
}

/// An HTTP Lambda's main: [`lambda_state`], then `routes` under [`app`], one invocation
/// at a time.
pub async fn run_lambda(
    bin: &'static str,
    routes: Router<AppState>,
) -> Result<(), lambda_http::Error> {
    let state = lambda_state(bin).await?;
    lambda_http::run(app(routes, state)).await
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
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn(observe::observe))
        .layer(axum::middleware::from_fn(flush_metrics))
        .with_state(state)
}

/// On Lambda, the metrics of the invocation go out as EMF once its answer is made (a no-op
/// in `airlock serve`, which serves them at `/metrics`).
async fn flush_metrics(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let resp = next.run(req).await;
    crate::metrics::flush_emf();
    resp
}

/// The safety net under every route: an error response that is not the contract's JSON
/// body (a rejection of an axum extractor or of a layer, which answer in plain text)
/// becomes one, with the stable code of its status. Our own extractors already answer in
/// JSON; this keeps a future `Path`, `Query` or layer from leaking text to the agent.
/// A body that missed its deadline (`airlock serve`, [`serve`]) is 408 `request_timeout`,
/// whatever the handler made of the failed read.
async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let deadline = req.extensions().get::<serve::BodyDeadline>().cloned();
    let resp = next.run(req).await;
    if deadline.is_some_and(|d| d.missed()) {
        return ApiError::new(
            Code::RequestTimeout,
            "The request body did not arrive in time; send the request again.",
        )
        .into_response();
    }
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        // The approval page answers browsers with its own plain error pages.
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    // What the route takes stays said (RFC 9110: a 405 names the allowed methods).
    let allow = resp.headers().get(axum::http::header::ALLOW).cloned();
    let text = axum::body::to_bytes(resp.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let (code, message) = match status.as_u16() {
        404 => (Code::NotFound, "No such endpoint. Paths live under /api/internal/v1/mastra."),
        405 => (Code::MethodNotAllowed, "This endpoint does not take that HTTP method."),
        413 => (Code::PayloadTooLarge, "The request body is larger than 64 KiB; send a smaller request."),
        415 => (Code::UnsupportedMediaType, "Send the request body as JSON with `Content-Type: application/json`."),
        503 => (Code::UpstreamUnavailable, "A storage or queue service is unavailable right now; nothing was half-written. Retry the same request shortly."),
        s if s >= 500 => (Code::Internal, "Airlock hit an internal error; nothing was changed. Try again, and report the request id if it persists."),
        _ => (Code::InvalidRequest, "The request is malformed (path, query or headers); check it against the API contract."),
    };
    let mut e = ApiError::new(code, message);
    e.cause = Some(format!("{status}: {text}"));
    let mut resp = e.into_response();
    if let Some(allow) = allow {
        resp.headers_mut().insert(axum::http::header::ALLOW, allow);
    }
    resp
}
