//! One round of execute: read the key, the plan and the control record, replay a decided
//! key, verify the confirmation token and the approval, then decide and commit.

use super::*;
use crate::core::usecases::actions;

/// One read-decide-commit round. `Ok(None)`: a condition changed under us; go again.
pub(super) async fn round(ctx: &Ctx<'_>) -> Result<Option<ExecuteOutcome>, ApiError> {
    let st = ctx.state;
    let now = st.clock.now_ms();
    let key = ctx.req.idempotency_key.as_str();

    // One read: the key, the plan, the control record and the rate state.
    let snap = st
        .ledger
        .snapshot(
            ctx.principal(),
            key,
            &ctx.req.plan_id,
            &ctx.caller.operator.sub,
            now,
        )
        .await?;

    if let Some(p) = &snap.plan {
        *ctx.action_type
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(p.action_type);
    }

    // Our last commit failed ambiguously: the key says whether it happened.
    let unsure = ctx.take_unsure();

    // 2. The idempotency key.
    if let Some(rec) = snap.key {
        if let Some(action) = ctx.own(&rec) {
            // Our own commit, whose answer was lost or whose conditions a retry of it
            // failed: carry on from it.
            return own_decision(ctx, &rec, action, now).await;
        }
        if rec.fingerprint != ctx.fingerprint {
            let e = ApiError::new(
                Code::IdempotencyKeyReused,
                "This idempotency key was already used for another plan or requester; use a new key for a new execute.",
            )
            .with_field("/idempotency_key", "already used for another plan or requester");
            return Err(ctx.reject(e, None).await);
        }
        return match rec.state.clone() {
            KeyState::Decided { decision, .. } => match accepted(&decision) {
                Some(a) => {
                    let mut audit = ctx.audit(now, "duplicate");
                    audit.action_id = Some(a.action_id.clone());
                    audit.order_id = a.resource_refs.order_id.clone();
                    audit.job_id = a.resource_refs.job_id.clone();
                    st.audit.append(&audit).await?;
                    Ok(Some(ExecuteOutcome::Duplicate(Accepted {
                        status: "duplicate",
                        ..a
                    })))
                }
                None => match decision {
                    Decision::Rejected {
                        code,
                        message,
                        details,
                    } => Err(ctx
                        .reject(replayed_rejection(&code, &message, &details), None)
                        .await),
                    Decision::Queued { .. } => unreachable!("handled above"),
                },
            },
            KeyState::Claimed {
                lease_until,
                action_id,
                ..
            } if lease_until > now => {
                let wait = ((lease_until - now) as u64).div_ceil(1000);
                let mut e = ApiError::new(
                    Code::IdempotencyKeyInFlight,
                    format!("The first request with this idempotency key is still running; retry in {wait} s with the same key."),
                )
                .retry_after(wait);
                e.action_id = Some(action_id);
                Err(ctx.reject(e, None).await)
            }
            KeyState::Claimed { action_id, .. } => {
                // The first attempt committed but its send failed: resume at the enqueue.
                resume(st, &rec, &action_id, ctx.facts.request_id, now).await
            }
        };
    }
    // Our last commit failed ambiguously and did not happen: that failure is the answer.
    if let Some(e) = unsure {
        return Err(e);
    }

    // 3. The confirmation token, locally (no signer call), when one was sent.
    let claims = match &ctx.req.confirmation_token {
        Some(token) => Some(verify_token(ctx, token, now).await?),
        None => None,
    };

    // The plan, as this operator may see it.
    let plan = match snap.plan {
        Some(p)
            if ctx.caller.can_see_desk(&p.desk)
                && p.service_principal == ctx.caller.service.sub =>
        {
            p
        }
        _ => {
            let e = not_found(Code::PlanNotFound, "plan", &ctx.req.plan_id);
            return Err(ctx.reject(e, None).await);
        }
    };
    // The confirmation this plan needs: its token, or its operator's approval.
    match (plan.confirmation, claims) {
        (ConfirmationMode::Token, Some(claims)) => {
            if claims.payload_hash != plan.payload_hash {
                let e = ApiError::new(
                    Code::TokenInvalid,
                    "The confirmation token does not match the plan's payload; ask for a new plan.",
                );
                return Err(ctx.reject(e, Some(&plan)).await);
            }
        }
        // Absent is a confirmation that does not verify: whether a token is needed depends
        // on the plan, not on the shape of the request.
        (ConfirmationMode::Token, None) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                "This plan is confirmed with its confirmation token; send the confirmation_token its plan returned.",
            )
            .with_field("/confirmation_token", "required for this plan");
            return Err(ctx.reject(e, Some(&plan)).await);
        }
        (ConfirmationMode::Operator, Some(_)) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                "This plan is approved by the operator on Airlock's approval page, not with a token; execute it without confirmation_token once approved.",
            );
            return Err(ctx.reject(e, Some(&plan)).await);
        }
        (ConfirmationMode::Operator, None) => {
            if plan.requested_by != ctx.req.requested_by {
                let e = ApiError::new(
                    Code::OperatorMismatch,
                    format!(
                        "Plan {} was requested by operator {}; only its requester executes it.",
                        plan.plan_id, plan.requested_by
                    ),
                );
                return Err(ctx.reject(e, Some(&plan)).await);
            }
            if let Some(e) = approval_gate(&ctx.state.approval_origin, &plan, now) {
                return Err(match e.code {
                    // Asked again and again while the operator has not decided.
                    Code::ApprovalRequired => ctx.reject_once(e, &plan).await,
                    _ => ctx.reject(e, Some(&plan)).await,
                });
            }
        }
    }

    // 4. Decide, then commit atomically.
    let verdict = match decide(ctx, &plan, &snap.control, snap.rate, now).await? {
        Verdict::Accept {
            rate,
            reserve,
            messages,
        } => {
            match accept(ctx, &plan, &snap.control, rate, reserve, messages, now).await? {
                Attempt::Done(outcome) => return Ok(Some(outcome)),
                Attempt::Retry => return Ok(None),
                // The exposure left no room under us: explain with the full re-check.
                Attempt::PositionMoved => {
                    match actions::of(plan.action_type)
                        .position_violation(st, &plan, &snap.control)
                        .await?
                    {
                        Some(error) => Verdict::Reject { error, close: true },
                        None => return Ok(None),
                    }
                }
                Attempt::AccountInactive => Verdict::Reject {
                    error: account_inactive(st, &plan).await?,
                    close: true,
                },
            }
        }
        reject => reject,
    };
    match verdict {
        Verdict::Accept { .. } | Verdict::Again => Ok(None),
        Verdict::Reject { error, close } => {
            let owner = new_id("own", now);
            let commit = ExecuteCommit {
                key: key_record(
                    ctx,
                    now,
                    KeyState::Decided {
                        decision: Decision::Rejected {
                            code: error.code.as_str().into(),
                            message: error.message.clone(),
                            details: error.details.clone(),
                        },
                        owner: Some(owner.clone()),
                    },
                ),
                key_condition: KeyCondition::Absent,
                plan_change: close.then(|| {
                    (
                        plan.plan_id.clone(),
                        PlanChange::Close {
                            reason_code: error.code.as_str().into(),
                        },
                    )
                }),
                control_version: None,
                account_active: None,
                rate: None,
                reserve: None,
                messages: None,
                action: None,
                enqueue_group: None,
                audit: ctx.audit_rejection(now, &error, Some(&plan)),
            };
            ctx.remember(&owner, None);
            match st.ledger.commit(&commit, now).await {
                Ok(CommitOutcome::Committed) => Err(error),
                Ok(CommitOutcome::Conflict(_)) => Ok(None),
                Err(e) => {
                    ctx.set_unsure(e.into());
                    Ok(None)
                }
            }
        }
    }
}

/// Verifies the confirmation token and its binding to this request (plan, requester,
/// service principal). A refusal is audited.
pub(super) async fn verify_token(
    ctx: &Ctx<'_>,
    token: &str,
    now: Millis,
) -> Result<crate::core::token::ConfirmationClaims, ApiError> {
    let claims = match ctx
        .state
        .confirmations
        .verify(token, now.div_euclid(1000))
        .await
    {
        Ok(c) => c,
        Err(TokenFault::Expired(exp)) => {
            let e = ApiError::new(
                Code::TokenExpired,
                format!(
                    "The confirmation token expired at {}; ask for a new plan and confirm it again.",
                    human_time(exp * 1000)
                ),
            );
            return Err(ctx.reject(e, None).await);
        }
        Err(TokenFault::Invalid(why)) => {
            let e = ApiError::new(
                Code::TokenInvalid,
                format!("The confirmation token is not valid: {why}. Use the token returned by the plan."),
            );
            return Err(ctx.reject(e, None).await);
        }
        // The signer's public key could not be fetched (KMS unreachable).
        Err(TokenFault::Unavailable) => {
            return Err(ApiError::new(
                Code::UpstreamUnavailable,
                "The confirmation key is unavailable; retry shortly.",
            ))
        }
    };
    let bound = [
        (
            claims.plan_id == ctx.req.plan_id,
            "it was issued for another plan",
        ),
        (
            claims.requested_by == ctx.req.requested_by,
            "it was issued for another requester",
        ),
        (
            claims.sub == ctx.caller.service.sub,
            "it was issued to another service principal",
        ),
    ];
    if let Some((_, why)) = bound.iter().find(|(ok, _)| !ok) {
        let e = ApiError::new(
            Code::TokenInvalid,
            format!(
                "The confirmation token is not valid: {why}. Use the token returned by this plan."
            ),
        );
        return Err(ctx.reject(e, None).await);
    }
    Ok(claims)
}

/// An `operator`-mode plan executes only once its operator approved it on the approval
/// page. Before that the answer is 409 `approval_required`, which decides nothing: no key
/// is recorded and no rate is used, so the same execute succeeds after the approval. A
/// declined, expired, executed or closed plan is left to [`decide`], which records it.
pub(super) fn approval_gate(origin: &str, plan: &PlanRecord, now: Millis) -> Option<ApiError> {
    if plan.awaits_approval(now) {
        let url = crate::core::usecases::plan::approval_url(origin, &plan.plan_id);
        let mut e = ApiError::new(
            Code::ApprovalRequired,
            format!(
                "Plan {} waits for the operator's approval: open {} and approve it with your passkey, then execute again with the same idempotency key (before {}).",
                plan.plan_id,
                url,
                human_time(plan.expires_at)
            ),
        );
        let info = crate::core::usecases::plan::ApprovalInfo {
            required: true,
            url,
            expires_at: rfc3339(plan.expires_at),
            four_eyes: plan.four_eyes,
            approved_by: plan.approvals.iter().map(|a| a.approver.clone()).collect(),
        };
        e.approval = serde_json::to_value(&info).ok().map(Box::new);
        return Some(e);
    }
    let not_matching = || {
        Some(ApiError::new(
            Code::PlanNotExecutable,
            "The approval on this plan does not match its payload; ask for a new plan.",
        ))
    };
    // An approval is bound to what was seen: the plan's payload hash, before expiry.
    let bound = |a: &crate::core::records::Approval| {
        a.decision == ApprovalDecision::Approved
            && a.payload_hash == plan.payload_hash
            && a.at < plan.expires_at
    };
    match &plan.approval {
        Some(a) if a.decision == ApprovalDecision::Approved && !bound(a) => not_matching(),
        // Four eyes: the requester's own approval and another operator's, both bound.
        Some(a) if a.decision == ApprovalDecision::Approved && plan.four_eyes => {
            let maker = plan
                .approvals
                .iter()
                .any(|a| a.approver == plan.requested_by && bound(a));
            let checker = plan
                .approvals
                .iter()
                .any(|a| a.approver != plan.requested_by && bound(a));
            if maker && checker {
                None
            } else {
                not_matching()
            }
        }
        _ => None,
    }
}

/// The key holds a decision this request committed: answer it. An accepted action is sent
/// now (the queue drops a second copy by its id, if the first send went through), unless
/// its commit queued it.
pub(super) async fn own_decision(
    ctx: &Ctx<'_>,
    rec: &KeyRecord,
    action: Option<ActionRecord>,
    now: Millis,
) -> Result<Option<ExecuteOutcome>, ApiError> {
    let owner = rec.owner().unwrap_or_default();
    match (&rec.state, action) {
        (KeyState::Decided { decision, .. }, Some(action)) if accepted(decision).is_some() => {
            if action.enqueued_at.is_none() {
                send(&ctx.state.dispatch, rec, owner, &action, now).await?;
            }
            Ok(Some(ExecuteOutcome::Queued(accepted_action(&action))))
        }
        (
            KeyState::Decided {
                decision:
                    Decision::Rejected {
                        code,
                        message,
                        details,
                    },
                ..
            },
            _,
        ) => Err(replayed_rejection(code, message, details)),
        _ => Err(ApiError::internal(format!(
            "execute: this request's key record {} is in an unexpected state",
            rec.key
        ))),
    }
}

pub(super) fn accepted_action(action: &ActionRecord) -> Accepted {
    Accepted {
        action_id: action.action_id.clone(),
        status: "queued",
        queue_target: action.queue_target,
        resource_refs: action.resource_refs.clone(),
        plan_id: action.plan_id.clone(),
    }
}
