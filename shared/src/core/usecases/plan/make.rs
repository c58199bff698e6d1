//! Making a plan: the request's bounds, the caller's rights and rate, the action type's
//! own evaluation, the confirmation it needs, and the stored plan with its audit record.

use super::*;
use crate::core::usecases::actions;
use crate::core::usecases::payload_hash;

/// One variant per action type: its `action_type` and the schema of its payload.
impl schemars::JsonSchema for PlanRequest {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "PlanRequest".into()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let chat = g.subschema_for::<ChatContext>();
        let variants: Vec<serde_json::Value> = actions::all()
            .map(|a| {
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "action_type": {"const": a.action_type().as_str()},
                        "payload": a.payload_schema(g),
                        "requested_by": requested_by_schema(),
                        "chat_context": {"anyOf": [chat.clone(), {"type": "null"}]}
                    },
                    "required": ["action_type", "payload", "requested_by"],
                    "additionalProperties": false
                })
            })
            .collect();
        schemars::json_schema!({
            "description": "An action to plan: its type, its payload, and the operator it is for.",
            "oneOf": variants
        })
    }
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
    crate::core::usecases::parse_requested_by(&req.requested_by)?;
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
    let action = actions::of(req.action_type);
    let cx = actions::PlanContext {
        planner: state,
        caller,
        control: &control,
    };
    let eval = action.evaluate(&cx, req.payload).await?;

    let now = state.clock.now_ms();
    let ttl_ms = state.confirmation_ttl_s as i64 * 1000;
    let expires_at = now + ttl_ms;
    let plan_id = new_id("pln", now);
    let hash = payload_hash(&eval.normalized.to_json());
    let executable = !eval.checks.iter().any(RiskCheck::failed);
    let pol = policy::in_force(&state.policy, &control);
    let policy_version = pol.full_version(ExchangeCalendar::cme());
    let confirmation = pol.confirmation(action.confirmed_as(&eval.normalized));
    let operator_mode = confirmation == policy::ConfirmationMode::Operator;
    let four_eyes = operator_mode && action.weighs_notional() && pol.needs_four_eyes(eval.notional);
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
        reference_price: eval.reference.map(|q| q.price),
        reference_observed_at: eval.reference.and_then(|q| q.observed_at),
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
