//! The decision of a round: the plan, the token and every re-check (kill switch, policy,
//! positions, the account, the rate limit) against what was read.

use super::*;
use crate::core::usecases::actions::{self, AtExecute};

pub(super) enum Verdict {
    Accept {
        rate: RateState,
        reserve: Option<Reservation>,
        messages: Option<crate::core::throttle::MessageUpdate>,
    },
    /// `close`: the plan is closed (kill switch, rollout mode, policy re-check).
    Reject { error: ApiError, close: bool },
    /// Held for room in the orders backlog, which there is now: read and decide again.
    Again,
}

pub(super) fn reject(error: ApiError, close: bool) -> Result<Verdict, ApiError> {
    Ok(Verdict::Reject { error, close })
}

pub(super) async fn decide(
    ctx: &Ctx<'_>,
    plan: &PlanRecord,
    control: &Control,
    mut rate: RateState,
    now: Millis,
) -> Result<Verdict, ApiError> {
    let st = ctx.state;
    match plan.status {
        PlanStatus::Executed => {
            return reject(
                ApiError::new(
                    Code::PlanAlreadyExecuted,
                    format!(
                        "This plan was already executed as action {}; check its status instead of executing again.",
                        plan.action_id.as_deref().unwrap_or("?")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Closed
            if plan.closed_reason.as_deref() == Some(Code::PlanDeclined.as_str()) =>
        {
            return reject(
                ApiError::new(
                    Code::PlanDeclined,
                    format!(
                        "The operator declined this plan on the approval page ({}); it will not execute. Plan again if the trade is still wanted.",
                        plan.approval.as_ref().map(|a| a.approver.as_str()).unwrap_or("declined")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Closed => {
            return reject(
                ApiError::new(
                    Code::PlanNotExecutable,
                    format!(
                        "This plan was closed when an execute was rejected ({}); ask for a new plan.",
                        plan.closed_reason.as_deref().unwrap_or("rejected")
                    ),
                ),
                false,
            )
        }
        PlanStatus::Planned => {}
    }
    if now >= plan.expires_at {
        return reject(
            ApiError::new(
                Code::PlanExpired,
                format!(
                    "The plan expired at {}; ask for a new plan.",
                    human_time(plan.expires_at)
                ),
            ),
            false,
        );
    }
    if !plan.executable {
        let failed: Vec<&str> = plan
            .risk_checks
            .iter()
            .filter(|c| c.failed())
            .map(|c| c.name.as_str())
            .collect();
        return reject(
            ApiError::new(
                Code::PlanNotExecutable,
                format!(
                    "The plan failed risk checks ({}); fix the request and plan again.",
                    failed.join(", ")
                ),
            ),
            false,
        );
    }
    if plan.normalized_payload.adds_risk() && !control.trade_execute_enabled {
        return reject(
            ApiError::new(
                Code::KillSwitchEngaged,
                "The kill switch is engaged: no orders can be submitted. This plan is now closed; plan again after the switch is released.",
            ),
            true,
        );
    }
    if !control.allows_execute(plan.action_type) {
        return reject(
            ApiError::new(
                Code::ActionDisabled,
                format!(
                    "{} is not enabled for execution (rollout mode {:?}). This plan is now closed.",
                    plan.action_type,
                    control.mode(plan.action_type)
                ),
            ),
            true,
        );
    }
    if let Some(why) = confirmation_short_of(plan, policy::in_force(&st.policy, control)) {
        return reject(
            ApiError::new(
                Code::PlanNotExecutable,
                format!("{why} This plan is now closed; ask for a new plan."),
            ),
            true,
        );
    }
    let reserve = match actions::of(plan.action_type)
        .at_execute(st, plan, control)
        .await?
    {
        AtExecute::Go(reserve) => reserve,
        AtExecute::Refuse(e) => return reject(e, true),
    };
    // The account's message throttle: not a decision either (the plan stays executable).
    let messages = super::throttle::messages(ctx, plan, control, now).await?;
    // Admission: not a decision either. An order accepted behind a deep queue would reach
    // the broker seconds after the operator confirmed it; refuse it now instead.
    if plan.action_type.is_order_submission() && !ctx.placed.load(Ordering::Relaxed) {
        let queue = st.dispatch.queue.as_ref();
        if let Some(e) = st.backlog.refusal(queue, now).await {
            // Held for room while this request's wait lasts; then decided afresh (a new
            // round: the world may have moved while it waited).
            let until = ctx.backlog_wait_until(st.backlog.wait);
            if st.backlog.room_by(queue, &st.clock, until).await {
                ctx.waited.store(true, Ordering::Relaxed);
                ctx.placed.store(true, Ordering::Relaxed);
                return Ok(Verdict::Again);
            }
            return Err(ctx.reject(e, Some(plan)).await);
        }
    }
    // Rate limit: not a decision, so nothing is recorded and the key can be retried.
    rate.operator_id = ctx.caller.operator.sub.clone();
    let how = " with the same idempotency key";
    let operator = &ctx.caller.operator.sub;
    if let Some(e) = crate::core::usecases::limits::rate_refusal(
        &rate,
        now,
        st.rate_per_minute,
        operator,
        "executes",
        how,
    ) {
        return Err(ctx.reject(e, Some(plan)).await);
    }
    Ok(Verdict::Accept {
        rate,
        reserve,
        messages,
    })
}

/// Why the confirmation this plan was given falls short of what the policy in force asks
/// now, if it does. The confirmation mode and the four-eyes rule are fixed on a plan when
/// it is made; a policy tightened since then (`airlock policy set`) must hold for the
/// plans already out, or an agent could still execute, for the rest of their lifetime,
/// plans confirmed the looser way. A plan confirmed more strictly than needed executes.
pub(super) fn confirmation_short_of(plan: &PlanRecord, pol: &Policy) -> Option<String> {
    let a = plan.action_type;
    match plan.confirmation {
        ConfirmationMode::Token
            if pol.confirmation(actions::of(a).confirmed_as(&plan.normalized_payload))
                == ConfirmationMode::Operator =>
        {
            Some(format!(
                "The policy in force now has {a} approved by its operator on the approval page; this plan was confirmed with a token under an earlier policy."
            ))
        }
        ConfirmationMode::Operator if actions::of(a).weighs_notional() && !plan.four_eyes => {
            // The plan's notional as the plan measured it, at its reference price; without
            // one (no reference price known) the second person is the safe answer, as at
            // plan time.
            let notional = plan.notional.or_else(|| {
                let terms = plan.normalized_payload.payload().order_terms()?;
                let price = plan.reference_price?;
                Some(actions::notional(terms.quantity, price))
            });
            pol.needs_four_eyes(notional).then(|| {
                "The policy in force now needs a second person's approval for an order of this size; this plan was approved by its requester alone under an earlier policy.".to_string()
            })
        }
        _ => None,
    }
}

pub(crate) fn policy_violation(failed: &[RiskCheck]) -> ApiError {
    let names: Vec<&str> = failed.iter().map(|c| c.name.as_str()).collect();
    ApiError::new(
        Code::PolicyViolation,
        format!(
            "A pre-trade check failed at execute ({}): {}. This plan is now closed; plan again when it can pass.",
            names.join(", "),
            failed.first().map(|c| c.reason.as_str()).unwrap_or("")
        ),
    )
    .with_details(
        failed
            .iter()
            .map(|c| crate::core::error::FieldError::new(format!("risk_checks/{}", c.name), c.reason.clone()))
            .collect(),
    )
}

/// The commit found the account no longer active: say what it is now.
pub(super) async fn account_inactive(
    st: &Executor,
    plan: &PlanRecord,
) -> Result<ApiError, ApiError> {
    let status = match st.accounts.get_account(&plan.account_id).await? {
        Some(a) => a.status.to_string(),
        None => "gone".to_string(),
    };
    let check = RiskCheck::fail(
        "account_allowed",
        format!("account {} is {status}, not active", plan.account_id),
    );
    Ok(policy_violation(&[check]))
}
