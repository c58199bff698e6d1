//! `POST /actions/plan`: validate, run risk checks, return a preview and a confirmation token.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};

use crate::app::AppState;
use crate::domain::ActionType;
use crate::error::ApiError;
use crate::http::api;
use crate::http::extract::check_text;
use crate::http::extract::{Authed, JsonBody, Query};
use crate::http::observe::current_request_id;
use crate::protocol::plan::{PlanRequest, PlanResponse};

pub fn routes() -> Router<AppState> {
    Router::new().route(&api("/actions/plan"), post(handler))
}

async fn handler(
    State(st): State<AppState>,
    Authed(caller): Authed,
    Query(q): Query,
    JsonBody(req): JsonBody<PlanRequest>,
) -> Result<Json<PlanResponse>, ApiError> {
    q.finish()?;
    check_plan_request(&req)?;
    Ok(Json(
        st.plan.plan(&caller, req, &current_request_id()).await?,
    ))
}

/// The longest `symbol` accepted, in bytes. A symbol that is merely unknown is a failed
/// `symbol_valid` check, not a malformed request; one this long is neither.
const MAX_SYMBOL_BYTES: usize = 32;

/// Bounds of a plan body that the typed parse does not enforce. Ids in the payload are
/// `Ident`s (`domain`), `requested_by` is checked by the protocol.
pub(crate) fn check_plan_request(req: &PlanRequest) -> Result<(), ApiError> {
    if let Some(c) = &req.chat_context {
        super::check_chat_context(c, "/chat_context")?;
    }
    if req.action_type == ActionType::OrderSubmitCl {
        if let Some(serde_json::Value::String(sym)) = req.payload.get("symbol") {
            if !sym.is_empty() {
                check_text("/payload/symbol", sym, MAX_SYMBOL_BYTES)?;
            }
        }
    }
    Ok(())
}
