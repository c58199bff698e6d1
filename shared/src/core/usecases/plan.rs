//! `POST /actions/plan`: parse the typed payload, run the risk checks, persist the plan
//! with its expiry and an audit record, and sign a confirmation token when executable.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{payload_hash, ChatContext};
use crate::core::auth::{Caller, Permission};
use crate::core::clock::SharedClock;
use crate::core::domain::calendar::ExchangeCalendar;
use crate::core::domain::cl::ClContract;
use crate::core::domain::payload::{
    NormalizedCancel, NormalizedOrder, NormalizedPayload, NormalizedSync,
};
use crate::core::domain::OrderTerms;
use crate::core::domain::{
    new_id, rfc3339, Account, ActionType, OrderCancel, OrderSubmitCl, OrderType, PositionsSync,
    Price, Side, TimeInForce,
};
use crate::core::error::{ApiError, Code};
use crate::core::parse::{check_text, from_value};
use crate::core::policy::Policy;
use crate::core::policy::{self, CancelInputs, OrderInputs};
use crate::core::ports::{
    AccountStore, ControlStore, OrderStore, PlanStore, PositionStore, Prices, Signer,
};
use crate::core::records::{AuditRecord, PlanRecord, PlanStatus, RiskCheck};
use crate::core::token::{self, ConfirmationClaims, CONFIRMATION_ISSUER};
use crate::core::usecases::reads::visible_account;

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

/// One variant per action type: its `action_type` and the schema of its payload.
impl schemars::JsonSchema for PlanRequest {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PlanRequest".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        use crate::core::domain::{OrderCancel, OrderSubmitCl, PositionsSync};
        let chat = g.subschema_for::<ChatContext>();
        let variant = |action: ActionType, payload: schemars::Schema| {
            serde_json::json!({
                "type": "object",
                "properties": {
                    "action_type": {"const": action.as_str()},
                    "payload": payload,
                    "requested_by": requested_by_schema(),
                    "chat_context": {"anyOf": [chat.clone(), {"type": "null"}]}
                },
                "required": ["action_type", "payload", "requested_by"],
                "additionalProperties": false
            })
        };
        let variants = vec![
            variant(
                ActionType::OrderSubmitCl,
                g.subschema_for::<OrderSubmitCl>(),
            ),
            variant(ActionType::OrderCancel, g.subschema_for::<OrderCancel>()),
            variant(
                ActionType::PositionsSync,
                g.subschema_for::<PositionsSync>(),
            ),
        ];
        schemars::json_schema!({
            "description": "An action to plan: its type, its payload, and the operator it is for.",
            "oneOf": variants
        })
    }
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

/// What an evaluated action amounts to, before it is stored.
struct Evaluated {
    account: Account,
    normalized: NormalizedPayload,
    checks: Vec<RiskCheck>,
    preview: String,
    reference: Option<Price>,
    /// Contracts x 1,000 barrels x the reference price, absolute, USD (orders only; `None`
    /// without a reference price).
    notional: Option<rust_decimal::Decimal>,
}

/// Barrels per CL contract.
pub const CL_CONTRACT_BARRELS: i64 = 1_000;

/// The notional of `quantity` contracts at `price`: absolute USD.
pub fn notional(quantity: u32, price: Price) -> rust_decimal::Decimal {
    // Saturates at the decimal range: above any four-eyes threshold, never a panic.
    (price.value().saturating_mul(rust_decimal::Decimal::from(
        quantity as i64 * CL_CONTRACT_BARRELS,
    )))
    .abs()
}

fn tif_words(t: TimeInForce) -> &'static str {
    match t {
        TimeInForce::Day => "day order",
        TimeInForce::Gtc => "good till cancelled",
        TimeInForce::Ioc => "immediate or cancel",
        TimeInForce::Fok => "fill or kill",
    }
}

/// "Buy 2 CLF27 at market on ACC-1, day order."
pub fn order_preview(o: &NormalizedOrder) -> String {
    let verb = match o.terms.side {
        Side::Buy => "Buy",
        Side::Sell => "Sell",
    };
    let how = match (o.terms.order_type, o.terms.limit_price, o.terms.stop_price) {
        (OrderType::Market, _, _) => "at market".to_string(),
        (OrderType::Limit, Some(l), _) => format!("limit {l}"),
        (OrderType::Stop, _, Some(s)) => format!("stop {s}"),
        (OrderType::StopLimit, Some(l), Some(s)) => format!("stop {s} limit {l}"),
        (t, _, _) => format!("as a {t} order (price missing)"),
    };
    format!(
        "{verb} {} {} {how} on {}, {}.",
        o.terms.quantity,
        o.terms.symbol,
        o.terms.account_id,
        tif_words(o.terms.time_in_force)
    )
}

/// Shared by plan and execute: the account's exposure in the contract (its position and
/// open orders), an input of the `order.submit.cl` checks.
pub async fn order_inputs_exposure(
    positions: &dyn PositionStore,
    account_id: &str,
    contract: Option<ClContract>,
) -> Result<crate::core::domain::Exposure, ApiError> {
    Ok(match contract {
        Some(c) => positions.get_exposure(account_id, &c.symbol()).await?,
        None => crate::core::domain::Exposure::default(),
    })
}

/// The reference price of the contract (the paper broker's price table), for the band.
async fn reference_price(
    state: &Planner,
    contract: Option<ClContract>,
) -> Result<Option<Price>, ApiError> {
    Ok(match contract {
        Some(c) => state.prices.reference_price(&c.symbol()).await?,
        None => None,
    })
}

/// `concentration` (what-if; `warn` at worst, never `fail`): the risk flags the order would
/// create, deepen or clear on its account's book, were it filled in full, with every
/// position at its reference price (`GET /portfolio/risk-flags`' flags and thresholds).
/// Other working orders are not assumed filled.
async fn concentration_check(
    state: &Planner,
    account: &Account,
    o: &OrderSubmitCl,
    contract: ClContract,
    pol: &Policy,
) -> Result<RiskCheck, ApiError> {
    const NAME: &str = "concentration";
    let symbol = contract.symbol();
    let (book, reference) = super::portfolio::account_book(
        state.positions.as_ref(),
        state.prices.as_ref(),
        account,
        &symbol,
    )
    .await?;
    let Some(reference) = reference else {
        return Ok(RiskCheck::warn(
            NAME,
            format!("no reference price for {symbol}: what the order does to the book's concentration cannot be computed"),
        ));
    };
    let quantity = i64::from(o.quantity.get());
    let delta = match o.side {
        Side::Buy => quantity,
        Side::Sell => -quantity,
    };
    let position = crate::core::domain::portfolio::Holding {
        account_id: account.account_id.clone(),
        desk: account.desk.clone(),
        symbol: symbol.clone(),
        quantity: 0,
        avg_price: None,
    };
    let w = crate::core::domain::portfolio::what_if(
        &book,
        &position,
        delta,
        Some(reference),
        super::portfolio::trade_date(state.clock.now_ms()),
        ExchangeCalendar::cme(),
        &pol.portfolio_thresholds(),
    );
    let share = match w.month_percent_after {
        Some(p) => format!(
            "after the order {} would hold {p}% of the account's gross notional",
            contract.contract_month()
        ),
        None => format!(
            "after the order the account would hold no {} notional",
            contract.contract_month()
        ),
    };
    let list = |flags: &[crate::core::domain::portfolio::Flag]| {
        flags
            .iter()
            .map(|f| format!("{} ({})", f.kind, f.message))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let mut parts = vec![share];
    if !w.created.is_empty() {
        parts.push(format!("creates {}", list(&w.created)));
    }
    if !w.deepened.is_empty() {
        parts.push(format!("deepens {}", list(&w.deepened)));
    }
    if !w.cleared.is_empty() {
        parts.push(format!("clears {}", list(&w.cleared)));
    }
    let reason = parts.join("; ");
    Ok(if w.created.is_empty() && w.deepened.is_empty() {
        RiskCheck::pass(
            NAME,
            format!("{reason}; no risk flag created or made worse"),
        )
    } else {
        RiskCheck::warn(NAME, reason)
    })
}

async fn evaluate_order(
    state: &Planner,
    caller: &Caller,
    o: OrderSubmitCl,
    control: &crate::core::records::Control,
) -> Result<Evaluated, ApiError> {
    let account = visible_account(state.accounts.as_ref(), caller, o.account_id.as_str()).await?;
    let cal = ExchangeCalendar::cme();
    let contract = ClContract::parse(&o.symbol).ok();
    let exposure =
        order_inputs_exposure(state.positions.as_ref(), &account.account_id, contract).await?;
    let pol = policy::in_force(&state.policy, control);
    let wants_notional = pol.four_eyes_above_notional.is_some()
        && pol.confirmation(ActionType::OrderSubmitCl) == policy::ConfirmationMode::Operator;
    let price_now = match (o.order_type, wants_notional) {
        (OrderType::Market, false) => None,
        _ => reference_price(state, contract).await?,
    };
    let reference = match o.order_type {
        OrderType::Market => None,
        _ => price_now,
    };
    let inputs = OrderInputs {
        policy: policy::in_force(&state.policy, control),
        calendar: cal,
        now: state.clock.now(),
        account_id: &account.account_id,
        order: &o,
        contract,
        exposure,
        reference,
    };
    let mut checks = policy::check_order_submit(&inputs, &account, control);
    if let Some(c) = contract {
        checks.push(concentration_check(state, &account, &o, c, inputs.policy).await?);
    }
    let normalized = NormalizedOrder {
        terms: OrderTerms {
            account_id: account.account_id.clone(),
            symbol: contract
                .map(|c| c.symbol())
                .unwrap_or_else(|| o.symbol.trim().to_ascii_uppercase()),
            side: o.side,
            quantity: o.quantity.get(),
            order_type: o.order_type,
            limit_price: o.limit_price,
            stop_price: o.stop_price,
            time_in_force: o.time_in_force,
        },
        contract_month: contract.map(|c| c.contract_month()),
        last_trade_date: contract.map(|c| c.last_trade_date(cal).to_string()),
    };
    Ok(Evaluated {
        preview: order_preview(&normalized),
        normalized: NormalizedPayload::OrderSubmitCl(normalized),
        account,
        checks,
        reference,
        notional: price_now.map(|p| notional(o.quantity.get(), p)),
    })
}

async fn evaluate_cancel(
    state: &Planner,
    caller: &Caller,
    c: OrderCancel,
    control: &crate::core::records::Control,
) -> Result<Evaluated, ApiError> {
    let account = visible_account(state.accounts.as_ref(), caller, c.account_id.as_str()).await?;
    let order = state.orders.get_order(c.order_id.as_str()).await?;
    let checks = policy::check_order_cancel(
        &CancelInputs {
            policy: policy::in_force(&state.policy, control),
            account: &account,
            order: order.as_ref(),
            order_id: c.order_id.as_str(),
        },
        control,
    );
    let detail = match &order {
        Some(o) if o.terms.account_id == account.account_id => format!(
            " ({} {} {} {}, {})",
            o.terms.side, o.terms.quantity, o.terms.symbol, o.terms.order_type, o.status
        ),
        _ => String::new(),
    };
    Ok(Evaluated {
        preview: format!(
            "Cancel order {}{detail} on {}.",
            c.order_id, account.account_id
        ),
        normalized: NormalizedPayload::OrderCancel(NormalizedCancel {
            account_id: account.account_id.clone(),
            order_id: c.order_id.as_str().to_string(),
        }),
        account,
        checks,
        reference: None,
        notional: None,
    })
}

async fn evaluate_sync(
    state: &Planner,
    caller: &Caller,
    s: PositionsSync,
    control: &crate::core::records::Control,
) -> Result<Evaluated, ApiError> {
    let account = visible_account(state.accounts.as_ref(), caller, s.account_id.as_str()).await?;
    let checks =
        policy::check_positions_sync(policy::in_force(&state.policy, control), &account, control);
    Ok(Evaluated {
        preview: format!(
            "Rebuild the positions of {} from the broker's view and record what changed.",
            account.account_id
        ),
        normalized: NormalizedPayload::PositionsSync(NormalizedSync {
            account_id: account.account_id.clone(),
        }),
        account,
        checks,
        reference: None,
        notional: None,
    })
}

impl Planner {
    /// Validates, runs the risk checks, stores the plan with its audit record, and signs a
    /// confirmation token when every check passes.
    pub async fn plan(
        &self,
        caller: &Caller,
        req: PlanRequest,
        request_id: &str,
    ) -> Result<PlanResponse, ApiError> {
        let result = plan(self, caller, req, request_id).await;
        // `airlock_plan_requests_total{action_type, executable}`: plans made (a refused
        // request is the HTTP metrics' status, not a plan).
        if let Ok(p) = &result {
            metrics::counter!(
                crate::metrics::PLAN_REQUESTS,
                "action_type" => p.action_type.as_str(),
                "executable" => if p.executable { "true" } else { "false" }
            )
            .increment(1);
        }
        result
    }
}

async fn plan(
    state: &Planner,
    caller: &Caller,
    req: PlanRequest,
    request_id: &str,
) -> Result<PlanResponse, ApiError> {
    check_plan_request(&req)?;
    caller.require(Permission::Plan)?;
    super::parse_requested_by(&req.requested_by)?;
    caller.check_requested_by(&req.requested_by)?;
    let chat = req.chat_context.unwrap_or_default();
    // The operator's plan rate, read with the control record: a full window refuses the plan
    // before any other work; a plan counts once it is stored (below).
    let operator = caller.operator.sub.as_str();
    let control = async { Ok::<_, ApiError>(state.control.get_control().await?) };
    let (control, rate) = tokio::try_join!(control, state.rate.window(operator))?;
    if let Some(e) = state.rate.refusal(&rate, operator) {
        return Err(e);
    }
    let eval = match req.action_type {
        ActionType::OrderSubmitCl => {
            let o: OrderSubmitCl = from_value(req.payload, "/payload")?;
            evaluate_order(state, caller, o, &control).await?
        }
        ActionType::OrderCancel => {
            let c: OrderCancel = from_value(req.payload, "/payload")?;
            evaluate_cancel(state, caller, c, &control).await?
        }
        ActionType::PositionsSync => {
            let s: PositionsSync = from_value(req.payload, "/payload")?;
            evaluate_sync(state, caller, s, &control).await?
        }
    };

    let now = state.clock.now_ms();
    let ttl_ms = state.confirmation_ttl_s as i64 * 1000;
    let expires_at = now + ttl_ms;
    let plan_id = new_id("pln", now);
    let hash = payload_hash(&eval.normalized.to_json());
    let executable = !eval.checks.iter().any(RiskCheck::failed);
    let pol = policy::in_force(&state.policy, &control);
    let policy_version = pol.full_version(ExchangeCalendar::cme());
    let confirmation = pol.confirmation(req.action_type);
    let operator_mode = confirmation == policy::ConfirmationMode::Operator;
    let four_eyes = operator_mode
        && req.action_type == ActionType::OrderSubmitCl
        && pol.needs_four_eyes(eval.notional);
    let confirmation_token = if executable && !operator_mode {
        let claims = ConfirmationClaims {
            iss: CONFIRMATION_ISSUER.into(),
            aud: state.confirmation_audience.clone(),
            sub: caller.service.sub.clone(),
            plan_id: plan_id.clone(),
            payload_hash: hash.clone(),
            requested_by: req.requested_by.clone(),
            iat: now.div_euclid(1000),
            exp: expires_at.div_euclid(1000),
            jti: new_id("cft", now),
        };
        let token = token::sign(state.signer.as_ref(), &claims).await?;
        state.confirmations.issued(&token, &claims);
        Some(token)
    } else {
        None
    };

    let record = PlanRecord {
        plan_id: plan_id.clone(),
        action_type: req.action_type,
        account_id: eval.account.account_id.clone(),
        desk: eval.account.desk.clone(),
        requested_by: req.requested_by.clone(),
        service_principal: caller.service.sub.clone(),
        normalized_payload: eval.normalized.clone(),
        payload_hash: hash.clone(),
        risk_checks: eval.checks.clone(),
        executable,
        preview: eval.preview.clone(),
        queue_target: req.action_type.queue_target(),
        policy_version: policy_version.clone(),
        status: PlanStatus::Planned,
        closed_reason: None,
        action_id: None,
        created_at: now,
        expires_at,
        chat_context: serde_json::to_value(&chat).unwrap_or_default(),
        request_id: request_id.to_string(),
        reference_price: eval.reference,
        confirmation,
        four_eyes,
        notional: pol.four_eyes_above_notional.and(eval.notional),
        approval: None,
        approvals: Vec::new(),
    };
    let failed: Vec<&str> = eval
        .checks
        .iter()
        .filter(|c| c.failed())
        .map(|c| c.name.as_str())
        .collect();
    let audit = AuditRecord {
        audit_id: new_id("aud", now),
        at: now,
        event: "plan".into(),
        decision: "planned".into(),
        reason_code: (!executable).then(|| Code::PlanNotExecutable.as_str().to_string()),
        reason: (!executable).then(|| format!("failed checks: {}", failed.join(", "))),
        action_type: Some(req.action_type),
        plan_id: Some(plan_id.clone()),
        action_id: None,
        idempotency_key: None,
        operator_id: caller.operator.sub.clone(),
        service_principal: caller.service.sub.clone(),
        payload_hash: Some(hash),
        risk_checks: eval.checks.clone(),
        order_id: None,
        job_id: None,
        chat_session_id: chat.chat_session_id.clone(),
        tool_call_id: chat.tool_call_id.clone(),
        request_id: request_id.to_string(),
        policy_version: Some(policy_version.clone()),
        approver: None,
        credential_id: None,
        user_verified: None,
        apigw_request_id: crate::telemetry::gateway_ids().0,
        lambda_request_id: crate::telemetry::gateway_ids().1,
    };
    state.rate.count(operator, rate).await?;
    state.plans.put_plan(&record, &audit).await?;

    let approval = (executable && operator_mode).then(|| ApprovalInfo {
        required: true,
        url: approval_url(&state.approval_origin, &plan_id),
        expires_at: rfc3339(expires_at),
        four_eyes,
        approved_by: Vec::new(),
    });
    Ok(PlanResponse {
        approval,
        plan_id,
        action_type: req.action_type,
        normalized_payload: eval.normalized,
        risk_checks: eval.checks,
        preview: eval.preview,
        executable,
        requires_confirmation: true,
        confirmation_token,
        expires_at: rfc3339(expires_at),
        queue_target: req.action_type.queue_target(),
        policy_version,
    })
}

/// The longest `symbol` accepted, in characters. A symbol that is merely unknown is a failed
/// `symbol_valid` check, not a malformed request; one this long is neither.
const MAX_SYMBOL_CHARS: usize = 32;

/// Bounds of a plan body that the typed parse does not enforce. Ids in the payload are
/// `Ident`s (`domain`), `requested_by` is checked by [`plan`].
pub fn check_plan_request(req: &PlanRequest) -> Result<(), ApiError> {
    if let Some(c) = &req.chat_context {
        c.validate("/chat_context")?;
    }
    if req.action_type == ActionType::OrderSubmitCl {
        if let Some(serde_json::Value::String(sym)) = req.payload.get("symbol") {
            if !sym.is_empty() {
                check_text("/payload/symbol", sym, MAX_SYMBOL_CHARS)?;
            }
        }
    }
    Ok(())
}
