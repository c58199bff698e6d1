//! `POST /actions/plan`: validate, run risk checks, return a preview and a confirmation token.

use axum::extract::State;
use axum::{Json, Router};
use serde_json::json;

use crate::app::AppState;
use crate::core::error::{ApiError, Code};
use crate::core::usecases::plan::{PlanRequest, PlanResponse};
use crate::doors::http::api;
use crate::doors::http::extract::{Authed, JsonBody, Query};
use crate::doors::http::observe::current_request_id;
use crate::doors::http::openapi::{schema, Api, Op};

pub fn api_doc() -> Api {
    Api::new().route(
        Op::post(api("/actions/plan"), "planAction")
            .tag("actions")
            .summary(
                "Plan an action",
                "Validates an action, runs its risk checks and returns a preview. Changes nothing at the broker. An executable plan carries a confirmation token (`token` confirmation) or the approval page's address (`operator` confirmation). A failed risk check is a plan with `executable: false`, not an error.",
            )
            .body(
                schema::<PlanRequest>,
                vec![
                    ("order", json!({
                        "action_type": "order.submit.cl",
                        "payload": {"account_id": "ACC-1", "symbol": "CLF27", "side": "buy", "quantity": 2,
                                    "order_type": "limit", "limit_price": "68.50", "time_in_force": "day"},
                        "requested_by": "op-energy-trader",
                        "chat_context": {"chat_session_id": "chat-42", "tool_call_id": "call-7"}
                    })),
                    ("cancel", json!({
                        "action_type": "order.cancel",
                        "payload": {"account_id": "ACC-1", "order_id": "ORD-1003"},
                        "requested_by": "op-energy-trader"
                    })),
                    ("sync", json!({
                        "action_type": "positions.sync",
                        "payload": {"account_id": "ACC-2"},
                        "requested_by": "op-energy-trader"
                    })),
                ],
            )
            .errors(&[
                Code::OperatorMismatch,
                Code::AccountNotFound,
                Code::OrderNotFound,
                Code::RateLimited,
            ])
            .answers(200, "The plan: preview, risk checks, and how to confirm it.", schema::<PlanResponse>)
            .example(json!({
                "plan_id": "pln_01kaq8m4x1a7c2e9f0g3h5",
                "action_type": "order.cancel",
                "normalized_payload": {"account_id": "ACC-1", "order_id": "ORD-1003"},
                "risk_checks": [
                    {"name": "action_enabled", "status": "pass", "reason": "order.cancel is enabled for execution"},
                    {"name": "kill_switch", "status": "pass", "reason": "trading is enabled (kill switch released)"},
                    {"name": "account_allowed", "status": "pass", "reason": "account ACC-1 is active"},
                    {"name": "order_exists", "status": "pass", "reason": "order ORD-1003 is on account ACC-1"},
                    {"name": "order_cancellable", "status": "pass", "reason": "order ORD-1003 is working"}
                ],
                "preview": "Cancel order ORD-1003 (buy 1 CLF27 limit, working) on ACC-1.",
                "executable": true,
                "requires_confirmation": true,
                "confirmation_token": "eyJhbGciOiJFUzI1NiIsImtpZCI6ImFpcmxvY2stMSJ9.eyJwbGFuX2lkIjoicGxuXzAxIn0.c2lnbmF0dXJl",
                "expires_at": "2026-11-23T15:05:00.000Z",
                "queue_target": "worker:orders",
                "policy_version": "default-1+cme-2026.1",
                "approval": null
            }))
            .links(json!({
                "ExecuteThePlan": {
                    "operationId": "executePlan",
                    "description": "Execute this plan with its confirmation token, for the same operator.",
                    "requestBody": {
                        "plan_id": "$response.body#/plan_id",
                        "confirmation_token": "$response.body#/confirmation_token",
                        "requested_by": "$request.body#/requested_by"
                    }
                }
            })),
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
    JsonBody(req): JsonBody<PlanRequest>,
) -> Result<Json<PlanResponse>, ApiError> {
    q.finish()?;
    Ok(Json(
        st.plan.plan(&caller, req, &current_request_id()).await?,
    ))
}
