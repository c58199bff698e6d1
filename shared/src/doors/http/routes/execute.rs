//! `POST /actions/execute`: plan id + confirmation token + idempotency key -> queued work.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::json;

use crate::app::AppState;
use crate::core::domain::IdempotencyKey;
use crate::core::error::{ApiError, Code};
use crate::core::usecases::execute::{ExecuteOutcome, ExecuteRequest, RequestFacts};
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, JsonBody, Query};
use crate::doors::http::observe::current_request_id;
use crate::doors::http::openapi::{schema, Api, Op};

pub fn api_doc() -> Api {
    let accepted = |status: &str| {
        json!({
            "action_id": "act_01kaq8n0c3d5f7h9j1k3m5",
            "status": status,
            "queue_target": "worker:orders",
            "resource_refs": {"order_id": "ord_01kaq8n0c3d5f7h9j1k3m6"},
            "plan_id": "pln_01kaq8m4x1a7c2e9f0g3h5"
        })
    };
    let action = || {
        json!({
            "GetTheAction": {
                "operationId": "getAction",
                "description": "Follow the action the workers carry out.",
                "parameters": {"action_id": "$response.body#/action_id"}
            }
        })
    };
    let mut replay = action();
    replay["ReplayTheExecute"] = json!({
        "operationId": "executePlan",
        "description": "The same request again (a retry): answers 200 with the same action.",
        "requestBody": {
            "plan_id": "$request.body#/plan_id",
            "confirmation_token": "$request.body#/confirmation_token",
            "idempotency_key": "$request.body#/idempotency_key",
            "requested_by": "$request.body#/requested_by"
        }
    });
    Api::new().route(
        Op::post(api("/actions/execute"), "executePlan")
            .tag("actions")
            .summary(
                "Execute a confirmed plan",
                "Queues a planned action for the workers, once: the plan id, its confirmation (the token, or the operator's approval on the approval page) and an idempotency key. A retry with the same key answers 200 with the same action; every rejection carries `status: rejected`.",
            )
            .header("Idempotency-Key", schema::<IdempotencyKey>, "The idempotency key, if sent as a header too: it must equal the body's `idempotency_key`.")
            .body(
                schema::<ExecuteRequest>,
                vec![("token", json!({
                    "plan_id": "pln_01kaq8m4x1a7c2e9f0g3h5",
                    "confirmation_token": "eyJhbGciOiJFUzI1NiIsImtpZCI6ImFpcmxvY2stMSJ9.eyJwbGFuX2lkIjoicGxuXzAxIn0.c2lnbmF0dXJl",
                    "idempotency_key": "chat-42:call-8",
                    "requested_by": "op-energy-trader",
                    "chat_context": {"chat_session_id": "chat-42", "tool_call_id": "call-8"}
                }))],
            )
            .errors(&[
                Code::OperatorMismatch,
                Code::KillSwitchEngaged,
                Code::ActionDisabled,
                Code::PlanNotFound,
                Code::PlanAlreadyExecuted,
                Code::IdempotencyKeyInFlight,
                Code::ApprovalRequired,
                Code::TokenInvalid,
                Code::TokenExpired,
                Code::PlanExpired,
                Code::PlanNotExecutable,
                Code::IdempotencyKeyReused,
                Code::PolicyViolation,
                Code::PlanDeclined,
                Code::RateLimited,
                Code::MessageThrottled,
                Code::OrdersBacklogged,
            ])
            .answers(202, "Queued: the workers carry out the action.", schema::<crate::core::usecases::execute::Accepted>)
            .example(accepted("queued"))
            .links(replay)
            .answers(200, "A retry with the same idempotency key: the action it queued the first time.", schema::<crate::core::usecases::execute::Accepted>)
            .example(accepted("duplicate"))
            .links(action()),
        handler,
    )
}

pub fn routes() -> Router<AppState> {
    api_doc().into_router()
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(q): Query,
    headers: HeaderMap,
    JsonBody(req): JsonBody<ExecuteRequest>,
) -> Result<Response, ApiError> {
    q.finish()?;
    let header_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("Idempotency-Key", "must be printable ASCII"))?,
        ),
    };
    let request_id = current_request_id();
    let facts = RequestFacts {
        request_id: &request_id,
        chat: req.chat_context.clone().unwrap_or_default(),
    };
    Ok(
        match st.execute.execute(&caller, req, header_key, facts).await? {
            ExecuteOutcome::Queued(a) => (StatusCode::ACCEPTED, Json(a)).into_response(),
            ExecuteOutcome::Duplicate(a) => (StatusCode::OK, Json(a)).into_response(),
        },
    )
}
