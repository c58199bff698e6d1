//! `POST /actions/plan`: parse the typed payload, run the risk checks, persist the plan
//! with its expiry and an audit record, and sign a confirmation token when executable.
//! The types and the use case's state are here; the plan itself is made in `plan/make.rs`
//! (each action type's own part in its module, `core::usecases::actions`).

mod make;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ChatContext;
use crate::core::auth::{Caller, Permission};
use crate::core::clock::SharedClock;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::payload::NormalizedPayload;
use crate::core::domain::{new_id, rfc3339, Account, ActionType};
use crate::core::error::{ApiError, Code};
use crate::core::policy::{self, Policy};
use crate::core::ports::{
    AccountStore, ControlStore, OrderStore, PlanStore, PositionStore, Prices, Signer,
};
use crate::core::records::{AuditRecord, PlanRecord, PlanStatus, RiskCheck};
use crate::core::token::{self, ConfirmationClaims, CONFIRMATION_ISSUER};

/// The plan use case, built once per process (`app.rs`) with the ports it reads and writes.
#[derive(Clone)]
pub struct Planner {
    pub clock: SharedClock,
    /// The process's policy; a policy in the control record takes precedence.
    pub policy: Arc<Policy>,
    /// Plan and confirmation-token lifetime, seconds.
    pub confirmation_ttl_s: u32,
    /// `aud` of the confirmation tokens it signs.
    pub confirmation_audience: String,
    pub accounts: Arc<dyn AccountStore>,
    pub positions: Arc<dyn PositionStore>,
    pub orders: Arc<dyn OrderStore>,
    pub control: Arc<dyn ControlStore>,
    pub plans: Arc<dyn PlanStore>,
    pub prices: Arc<dyn Prices>,
    pub signer: Arc<dyn Signer>,
    /// Told of each token signed here, so an execute in the same process skips its ES256
    /// check (the execute side's verifier, shared).
    pub confirmations: Arc<crate::core::token::ConfirmationVerifier>,
    /// Where operators approve plans (`AIRLOCK_APPROVAL_ORIGIN`): the approval page of a
    /// plan is `<origin>/approvals/plans/<plan_id>`.
    pub approval_origin: String,
    /// Stored plans per operator per sliding minute.
    pub rate: crate::core::usecases::limits::PlanRate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    pub action_type: ActionType,
    pub payload: serde_json::Value,
    pub requested_by: String,
    #[serde(default)]
    pub chat_context: Option<ChatContext>,
}

/// `requested_by`: the operator id, 1 to 256 characters without control characters.
pub fn requested_by_schema() -> serde_json::Value {
    serde_json::json!({
        "type": "string", "minLength": 1, "maxLength": 256,
        "pattern": crate::core::domain::PRINTABLE_PATTERN,
        "description": "The operator the request is made for: the operator token's `sub`."
    })
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PlanResponse {
    pub plan_id: String,
    pub action_type: ActionType,
    pub normalized_payload: NormalizedPayload,
    pub risk_checks: Vec<RiskCheck>,
    pub preview: String,
    pub executable: bool,
    pub requires_confirmation: bool,
    pub confirmation_token: Option<String>,
    pub expires_at: String,
    pub queue_target: crate::core::domain::QueueTarget,
    pub policy_version: String,
    /// `operator` confirmation: where the operator approves. `null` when the caller
    /// confirms with the token, or when the plan is not executable.
    pub approval: Option<ApprovalInfo>,
}

/// Where and until when an `operator`-mode plan can be approved. The URL names the plan
/// and carries nothing that lets its holder approve: the page needs a passkey.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ApprovalInfo {
    pub required: bool,
    pub url: String,
    pub expires_at: String,
    /// Two approvals are needed: the requester's own and a second operator's with
    /// `approve` on the desk (the policy's `four_eyes_above_notional`).
    pub four_eyes: bool,
    /// Who has approved so far (in 409 `approval_required`: a four-eyes plan waiting for
    /// its second approval names the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
}

/// The approval page of a plan.
pub fn approval_url(origin: &str, plan_id: &str) -> String {
    format!("{}/approvals/plans/{plan_id}", origin.trim_end_matches('/'))
}

/// What an evaluated action amounts to, before it is stored: what an action type's module
/// ([`crate::core::usecases::actions::Action::evaluate`]) answers.
pub struct Evaluated {
    pub account: Account,
    pub normalized: NormalizedPayload,
    pub checks: Vec<RiskCheck>,
    pub preview: String,
    /// The reference price the checks used, with its time.
    pub reference: Option<crate::core::ports::Quote>,
    /// Contracts x 1,000 barrels x the reference price, absolute, USD (orders only; `None`
    /// without a reference price).
    pub notional: Option<rust_decimal::Decimal>,
}

/// Bounds of a plan body that the typed parse does not enforce. Ids in the payload are
/// `Ident`s (`domain`), `requested_by` is checked by [`plan`], the payload by its action
/// type's module.
pub fn check_plan_request(req: &PlanRequest) -> Result<(), ApiError> {
    if let Some(c) = &req.chat_context {
        c.validate("/chat_context")?;
    }
    Ok(())
}
