//! Request ids and the one structured log line per request.
//!
//! Every response carries `x-request-id` (always minted here, never taken from the
//! client). One span per request carries the id; the closing line logs method, path,
//! status, latency and the operator and service principal, never a token. A path that
//! carries a secret (an enrolment link's) is logged with the secret replaced
//! ([`logged_path`]); the metric's labels are closed sets ([`method_label`]).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use tracing::Instrument;

use crate::core::error::ApiError;

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
    crate::core::domain::new_id("req", chrono::Utc::now().timestamp_millis())
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

/// The route parameter that holds a secret: a route naming it is logged as its template.
pub const SECRET_PARAM: &str = "{secret}";

/// Where a secret follows in a path no route matched (a mistyped enrolment link).
const SECRET_PREFIXES: &[&str] = &["/approvals/enroll/"];

/// The path as the request log shows it: the raw path (ids help the reader), except that a
/// secret in it is never written. A route whose template names [`SECRET_PARAM`] is logged
/// as its template (`/approvals/enroll/{secret}/start`); a path no route matched is cut
/// after any prefix a secret follows (`/approvals/enroll/{redacted}`).
pub fn logged_path(route: Option<&str>, path: &str) -> String {
    match route {
        Some(template) if template.contains(SECRET_PARAM) => template.to_string(),
        Some(_) => path.to_string(),
        None => SECRET_PREFIXES
            .iter()
            .find_map(|p| path.find(p).map(|at| at + p.len()))
            .map_or_else(
                || path.to_string(),
                |end| format!("{}{{redacted}}", &path[..end]),
            ),
    }
}

/// The method as a metric label: the methods of RFC 9110 by name, any other `other`, so
/// made-up methods cannot add series.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    match method.as_str() {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "other",
    }
}

pub async fn observe(mut req: Request, next: Next) -> Response {
    let request_id = new_request_id();
    let start = Instant::now();
    let method = req.method().to_string();
    let method_label = method_label(req.method());
    // The route as registered (`/actions/{action_id}`), never the raw path: metric labels
    // carry no ids. A path no route matched is `unmatched`.
    let matched = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_string());
    let path = logged_path(matched.as_deref(), req.uri().path());
    let route = matched.unwrap_or_else(|| "unmatched".to_string());
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
        "method" => method_label,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_in_a_path_is_never_logged() {
        let t = "/approvals/enroll/{secret}/start";
        assert_eq!(logged_path(Some(t), "/approvals/enroll/s3cr3t/start"), t);
        assert_eq!(
            logged_path(Some("/approvals/plans/{plan_id}"), "/approvals/plans/pln_1"),
            "/approvals/plans/pln_1"
        );
        assert_eq!(
            logged_path(None, "/approvals/enroll/s3cr3t/start/"),
            "/approvals/enroll/{redacted}"
        );
        assert_eq!(
            logged_path(None, "/prod/approvals/enroll/s3cr3t"),
            "/prod/approvals/enroll/{redacted}"
        );
        assert_eq!(logged_path(None, "/no/such/path"), "/no/such/path");
    }

    #[test]
    fn made_up_methods_share_one_label() {
        use axum::http::Method;
        for m in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            assert_eq!(method_label(&Method::from_bytes(m.as_bytes()).unwrap()), m);
        }
        for m in ["FOO", "get", "PROPFIND", "X-1"] {
            assert_eq!(
                method_label(&Method::from_bytes(m.as_bytes()).unwrap()),
                "other"
            );
        }
    }
}
