//! The one error type that crosses layers. `http::error` is the one place it becomes HTTP.
//!
//! Clients get a stable `code`, a sentence a person or an LLM can act on, and optionally the
//! fields at fault. The `cause` is for logs only and never reaches a client.

use std::fmt;

macro_rules! codes {
    ($($variant:ident => $text:literal,)+) => {
        /// Stable error codes of the contract. The HTTP status of each lives in `http::error`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code { $($variant),+ }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $text),+ }
            }
        }
    };
}

codes! {
    InvalidRequest => "invalid_request",
    PayloadTooLarge => "payload_too_large",
    UnsupportedMediaType => "unsupported_media_type",
    RequestTimeout => "request_timeout",
    NotFound => "not_found",
    MethodNotAllowed => "method_not_allowed",
    Unauthenticated => "unauthenticated",
    OperatorUnauthenticated => "operator_unauthenticated",
    InsufficientScope => "insufficient_scope",
    OperatorMismatch => "operator_mismatch",
    InvalidCursor => "invalid_cursor",
    AccountNotFound => "account_not_found",
    OrderNotFound => "order_not_found",
    ActionNotFound => "action_not_found",
    PlanNotFound => "plan_not_found",
    TokenInvalid => "token_invalid",
    TokenExpired => "token_expired",
    PlanExpired => "plan_expired",
    PlanNotExecutable => "plan_not_executable",
    PlanAlreadyExecuted => "plan_already_executed",
    IdempotencyKeyReused => "idempotency_key_reused",
    IdempotencyKeyInFlight => "idempotency_key_in_flight",
    KillSwitchEngaged => "kill_switch_engaged",
    ActionDisabled => "action_disabled",
    PolicyViolation => "policy_violation",
    RateLimited => "rate_limited",
    MessageThrottled => "message_throttled",
    OrdersBacklogged => "orders_backlogged",
    ApprovalRequired => "approval_required",
    PlanDeclined => "plan_declined",
    SignInRequired => "sign_in_required",
    CsrfRejected => "csrf_rejected",
    ApprovalRefused => "approval_refused",
    PlanNotPending => "plan_not_pending",
    PasskeyInvalid => "passkey_invalid",
    EnrolmentNotFound => "enrolment_not_found",
    UpstreamUnavailable => "upstream_unavailable",
    Internal => "internal",
}

impl Code {
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == s)
    }

    /// Rejections of `POST /actions/execute` (the contract's execute table) carry
    /// `status: "rejected"` in their body.
    pub fn is_execute_rejection(self) -> bool {
        use Code::*;
        matches!(
            self,
            TokenInvalid
                | TokenExpired
                | PlanNotFound
                | PlanExpired
                | PlanNotExecutable
                | PlanAlreadyExecuted
                | IdempotencyKeyReused
                | IdempotencyKeyInFlight
                | KillSwitchEngaged
                | ActionDisabled
                | PolicyViolation
                | RateLimited
                | MessageThrottled
                | OrdersBacklogged
                | ApprovalRequired
                | PlanDeclined
        )
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One bad field: a JSON pointer into the request (`/payload/quantity`) or a query
/// parameter name (`limit`), and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: Code,
    pub message: String,
    pub details: Vec<FieldError>,
    /// Seconds, for 409 in-flight and 429.
    pub retry_after: Option<u32>,
    /// The action an in-flight idempotency key is working on (409), at the top level.
    pub action_id: Option<String>,
    /// Where the operator approves the plan (409 `approval_required`), at the top level.
    pub approval: Option<Box<serde_json::Value>>,
    /// For logs only; never sent to a client.
    pub cause: Option<String>,
    /// Answered by another use case under a code of execute's table (a plan's
    /// `rate_limited`): its body carries no `status: "rejected"`.
    pub not_an_execute: bool,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            details: Vec::new(),
            // An upstream outage is always worth retrying: say when, 1 s unless told.
            retry_after: (code == Code::UpstreamUnavailable).then_some(1),
            action_id: None,
            approval: None,
            cause: None,
            not_an_execute: false,
        }
    }

    /// See [`ApiError::not_an_execute`].
    pub fn not_an_execute(mut self) -> Self {
        self.not_an_execute = true;
        self
    }

    pub fn with_details(mut self, details: Vec<FieldError>) -> Self {
        self.details = details;
        self
    }

    pub fn with_field(mut self, field: impl Into<String>, message: impl Into<String>) -> Self {
        self.details.push(FieldError::new(field, message));
        self
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds.clamp(1, u32::MAX as u64) as u32);
        self
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        let field = field.into();
        let message = message.into();
        ApiError::new(
            Code::InvalidRequest,
            format!("The request is invalid: {field}: {message}."),
        )
        .with_field(field, message)
    }

    /// [`ApiError::invalid`] at a JSON pointer into the body (`/` for the body itself).
    pub fn invalid_at(pointer: String, message: &str) -> Self {
        let field = if pointer.is_empty() {
            "/".to_string()
        } else {
            pointer
        };
        ApiError::new(
            Code::InvalidRequest,
            format!("The request is invalid at {field}: {message}."),
        )
        .with_field(field, message)
    }

    pub fn internal(cause: impl Into<String>) -> Self {
        ApiError {
            cause: Some(cause.into()),
            ..ApiError::new(
                Code::Internal,
                "Airlock hit an internal error; nothing was changed. Try again, and report the request id if it persists.",
            )
        }
    }

    pub fn unavailable(cause: impl Into<String>) -> Self {
        ApiError {
            cause: Some(cause.into()),
            ..ApiError::new(
                Code::UpstreamUnavailable,
                "A storage or queue service is unavailable right now; nothing was half-written. Retry the same request shortly.",
            )
        }
    }
}

/// Errors of a storage, queue or signing adapter. They map to 503 (retryable) or 500.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or refused for now (busy, throttled, timed out).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// Data in the store does not parse: a bug or a manual edit.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(c) => ApiError::unavailable(c),
            StoreError::Corrupt(c) => ApiError::internal(c),
        }
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
