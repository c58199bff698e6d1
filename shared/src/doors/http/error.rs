//! The one place errors become HTTP: status codes per error code, the contract's error
//! body, `Retry-After`, and logging of causes (never sent to clients).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::core::error::{ApiError, Code};
use crate::doors::http::observe::current_request_id;

pub fn status_of(code: Code) -> StatusCode {
    use Code::*;
    match code {
        InvalidRequest | InvalidCursor => StatusCode::BAD_REQUEST,
        PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        NotFound | AccountNotFound | OrderNotFound | ActionNotFound | PlanNotFound => {
            StatusCode::NOT_FOUND
        }
        MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        Unauthenticated | OperatorUnauthenticated => StatusCode::UNAUTHORIZED,
        InsufficientScope | OperatorMismatch | KillSwitchEngaged | ActionDisabled => {
            StatusCode::FORBIDDEN
        }
        TokenInvalid | TokenExpired | PlanExpired | PlanNotExecutable | IdempotencyKeyReused
        | PolicyViolation | PlanDeclined | PasskeyInvalid => StatusCode::UNPROCESSABLE_ENTITY,
        PlanAlreadyExecuted | IdempotencyKeyInFlight | ApprovalRequired | PlanNotPending => {
            StatusCode::CONFLICT
        }
        SignInRequired => StatusCode::UNAUTHORIZED,
        CsrfRejected | ApprovalRefused => StatusCode::FORBIDDEN,
        EnrolmentNotFound => StatusCode::NOT_FOUND,
        RateLimited | MessageThrottled => StatusCode::TOO_MANY_REQUESTS,
        UpstreamUnavailable | OrdersBacklogged => StatusCode::SERVICE_UNAVAILABLE,
        Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The contract's error body.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
    pub request_id: String,
    /// `rejected` on an execute's rejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    /// The action a rejection is about, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_id: Option<&'a str>,
    /// Where the operator approves the plan (409 `approval_required`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<&'a serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    pub code: &'static str,
    pub message: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub details: &'a [crate::core::error::FieldError],
}

/// The contract's error body for `e`, with the current request id.
pub fn error_body(e: &ApiError) -> ErrorBody<'_> {
    ErrorBody {
        error: ErrorDetail {
            code: e.code.as_str(),
            message: &e.message,
            details: &e.details,
        },
        request_id: current_request_id(),
        status: (e.code.is_execute_rejection() && !e.not_an_execute).then_some("rejected"),
        action_id: e.action_id.as_deref(),
        approval: e.approval.as_deref(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status_of(self.code);
        // A 5xx is a failure, logged as an error, except the orders backlog: load shed on
        // purpose (the caller retries after `Retry-After`), which must not page anyone.
        let shed = self.code == Code::OrdersBacklogged;
        if status.is_server_error() && !shed {
            tracing::error!(
                code = self.code.as_str(),
                cause = self.cause.as_deref().unwrap_or(""),
                "request failed"
            );
        } else if shed || self.cause.is_some() {
            tracing::warn!(
                code = self.code.as_str(),
                cause = self.cause.as_deref().unwrap_or(""),
                "request refused"
            );
        }
        let mut resp = (status, axum::Json(error_body(&self))).into_response();
        if matches!(self.code, Code::PayloadTooLarge | Code::RequestTimeout) {
            // The unread body makes the connection unusable: tell the client not to reuse it.
            resp.headers_mut()
                .insert("connection", HeaderValue::from_static("close"));
        }
        if let Some(s) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}
