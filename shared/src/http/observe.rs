//! Request ids and the one structured log line per request.
//!
//! Every response carries `x-request-id` (always minted here, never taken from the
//! client). One span per request carries the id; the closing line logs method, path,
//! status, latency and the operator and service principal, never a token.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::Instrument;

use crate::error::ApiError;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The id of the request being served ("" outside a request).
pub fn current_request_id() -> String {
    REQUEST_ID.try_with(|r| r.clone()).unwrap_or_default()
}

/// Filled by the auth extractor so the closing log line can name who called.
#[derive(Default)]
pub struct CallerSlot {
    pub who: OnceLock<(String, String)>,
}

pub fn new_request_id() -> String {
    crate::domain::new_id("req", chrono::Utc::now().timestamp_millis())
}

/// On Lambda, API Gateway's request id (from the event's request context) and the
/// invocation's request id, which `lambda_http` leaves in the request's extensions.
fn gateway_ids(req: &Request) -> (Option<String>, Option<String>) {
    use lambda_http::request::RequestContext;
    let apigw = req
        .extensions()
        .get::<RequestContext>()
        .and_then(|c| match c {
            RequestContext::ApiGatewayV1(c) => c.request_id.clone(),
            RequestContext::ApiGatewayV2(c) => c.request_id.clone(),
            _ => None,
        });
    let lambda = req
        .extensions()
        .get::<lambda_http::Context>()
        .map(|c| c.request_id.clone())
        .filter(|id| !id.is_empty());
    (apigw, lambda)
}

pub async fn observe(mut req: Request, next: Next) -> Response {
    let request_id = new_request_id();
    let start = Instant::now();
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    // The route as registered (`/actions/{action_id}`), never the raw path: metric labels
    // carry no ids. A path no route matched is `unmatched`.
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched".to_string(), |m| m.as_str().to_string());
    let slot = Arc::new(CallerSlot::default());
    req.extensions_mut().insert(slot.clone());
    let (apigw, lambda) = gateway_ids(&req);
    let span = tracing::info_span!(
        "request",
        request_id = %request_id,
        apigw_request_id = apigw.as_deref().unwrap_or(""),
        lambda_request_id = lambda.as_deref().unwrap_or(""),
        method = %method,
        path = %path
    );
    let run = REQUEST_ID.scope(
        request_id.clone(),
        crate::telemetry::with_gateway_ids(
            (apigw, lambda),
            crate::telemetry::with_call_log(
                std::panic::AssertUnwindSafe(next.run(req)).catch_unwind(),
            ),
        ),
    );
    let (outcome, calls) = run.instrument(span.clone()).await;
    let mut resp = match outcome {
        Ok(r) => r,
        Err(_) => {
            REQUEST_ID
                .scope(request_id.clone(), async {
                    ApiError::internal("handler panicked").into_response()
                })
                .instrument(span.clone())
                .await
        }
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    let elapsed = start.elapsed();
    metrics::histogram!(
        crate::metrics::HTTP_DURATION,
        "route" => route,
        "method" => method.clone(),
        "status" => resp.status().as_u16().to_string()
    )
    .record(elapsed.as_secs_f64());
    let (operator, service) = slot.who.get().cloned().unwrap_or_default();
    let _g = span.enter();
    tracing::info!(
        request_id = %request_id,
        method = %method,
        path = %path,
        status = resp.status().as_u16(),
        latency_ms = elapsed.as_secs_f64() * 1000.0,
        operator = %operator,
        service_principal = %service,
        backend_calls = %calls.join(","),
        "request"
    );
    resp
}
