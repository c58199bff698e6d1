//! Accepting: the one atomic commit that decides the key, consumes the plan, stores the
//! action and its audit record, and its outcomes (committed, conflict, unknown).

use super::*;

pub(super) fn key_record(ctx: &Ctx<'_>, now: Millis, state: KeyState) -> KeyRecord {
    KeyRecord {
        principal: ctx.principal().to_string(),
        key: ctx.req.idempotency_key.as_str().to_string(),
        fingerprint: ctx.fingerprint.clone(),
        plan_id: ctx.req.plan_id.clone(),
        requested_by: ctx.req.requested_by.clone(),
        state,
        created_at: now,
        expires_at: now + REPLAY_WINDOW_MS,
    }
}

/// How an accept attempt ended.
pub(super) enum Attempt {
    Done(ExecuteOutcome),
    /// Another request changed a condition; read and decide again.
    Retry,
    /// The exposure left no room for the order.
    PositionMoved,
    /// The account is no longer active.
    AccountInactive,
}

pub(super) async fn accept(
    ctx: &Ctx<'_>,
    plan: &PlanRecord,
    control: &Control,
    rate: RateState,
    reserve: Option<Reservation>,
    messages: Option<crate::core::throttle::MessageUpdate>,
    now: Millis,
) -> Result<Attempt, ApiError> {
    let st = ctx.state;
    let action_id = new_id("act", now);
    let refs = match plan.action_type.queue_target() {
        QueueTarget::Orders => ResourceRefs {
            // A cancel or a change acts on an existing order; a new order gets its id.
            order_id: Some(
                plan.normalized_payload
                    .payload()
                    .existing_order_id()
                    .map_or_else(|| new_id("ord", now), str::to_string),
            ),
            job_id: None,
        },
        QueueTarget::Jobs => ResourceRefs {
            order_id: None,
            job_id: Some(new_id("job", now)),
        },
    };
    let plan_chat = |k: &str| {
        plan.chat_context
            .get(k)
            .and_then(|v| v.as_str())
            .map(String::from)
    };
    let message = QueueMessage {
        schema: QUEUE_MESSAGE_SCHEMA.into(),
        action_id: action_id.clone(),
        plan_id: plan.plan_id.clone(),
        action_type: plan.action_type,
        normalized_payload: plan.normalized_payload.clone(),
        resource_refs: refs.clone(),
        requested_by: plan.requested_by.clone(),
        service_principal: plan.service_principal.clone(),
        enqueued_at: rfc3339(now),
        trace: Trace {
            request_id: ctx.facts.request_id.to_string(),
            // The execute's chat turn if it named one, else the plan's.
            chat_session_id: ctx
                .facts
                .chat
                .chat_session_id
                .clone()
                .or_else(|| plan_chat("chat_session_id")),
            tool_call_id: ctx
                .facts
                .chat
                .tool_call_id
                .clone()
                .or_else(|| plan_chat("tool_call_id")),
            apigw_request_id: crate::telemetry::gateway_ids().0,
            lambda_request_id: crate::telemetry::gateway_ids().1,
        },
    };
    let action = ActionRecord {
        action_id: action_id.clone(),
        plan_id: plan.plan_id.clone(),
        action_type: plan.action_type,
        status: ActionStatus::Queued,
        queue_target: plan.action_type.queue_target(),
        resource_refs: refs.clone(),
        account_id: plan.account_id.clone(),
        desk: plan.desk.clone(),
        requested_by: plan.requested_by.clone(),
        service_principal: plan.service_principal.clone(),
        idempotency_key: ctx.req.idempotency_key.as_str().to_string(),
        message,
        enqueued_at: None,
        created_at: now,
        updated_at: now,
        error: None,
    };
    // Where the ledger can, the commit queues the message itself (the embedded store's
    // outbox) and the action is stored sent; otherwise (SQS) it is sent after the commit.
    // Test-only: `execute.send_after_commit` takes the second path on the embedded store
    // too, so its commit-then-send window (the sweeper's work) is tested on both backends.
    let in_commit =
        st.ledger.queues_in_commit() && !crate::failpoint::hit("execute.send_after_commit");
    let mut action = action;
    if in_commit {
        action.enqueued_at = Some(now);
    }
    let owner = new_id("own", now);
    let mut audit = ctx.audit(now, "queued");
    audit.action_type = Some(plan.action_type);
    audit.action_id = Some(action_id.clone());
    audit.payload_hash = Some(plan.payload_hash.clone());
    audit.risk_checks = plan.risk_checks.clone();
    audit.policy_version = Some(plan.policy_version.clone());
    audit.order_id = refs.order_id.clone();
    audit.job_id = refs.job_id.clone();
    audit.chat_session_id = action.message.trace.chat_session_id.clone();
    audit.tool_call_id = action.message.trace.tool_call_id.clone();
    // Decided at the atomic step: nothing is written after the send.
    let key = key_record(
        ctx,
        now,
        KeyState::Decided {
            decision: Decision::Queued {
                action_id: action_id.clone(),
                plan_id: plan.plan_id.clone(),
                queue_target: action.queue_target,
                resource_refs: refs.clone(),
            },
            owner: Some(owner.clone()),
        },
    );
    let commit = ExecuteCommit {
        key: key.clone(),
        key_condition: KeyCondition::Absent,
        plan_change: Some((
            plan.plan_id.clone(),
            PlanChange::Execute {
                action_id: action_id.clone(),
            },
        )),
        control_version: Some(control.version),
        // Cancels and syncs reduce risk: they run on a suspended account too.
        account_active: plan
            .normalized_payload
            .adds_risk()
            .then(|| plan.account_id.clone()),
        rate: Some(rate.next(now, st.rate_per_minute)),
        reserve,
        messages,
        action: Some(action.clone()),
        enqueue_group: in_commit.then(|| action.message.normalized_payload.message_group()),
        audit,
    };
    // Remembered before the commit: after a lost reply, the key found ours is this one.
    ctx.remember(&owner, Some(&action));
    let committed = match st.ledger.commit(&commit, now).await {
        // Test-only: the write happened but its reply was lost (the request cannot tell).
        Ok(CommitOutcome::Committed) if crate::failpoint::hit("execute.commit_reply_lost") => {
            Err(crate::core::error::StoreError::Unavailable(
                "failpoint execute.commit_reply_lost".into(),
            ))
        }
        other => other,
    };
    match committed {
        Ok(CommitOutcome::Conflict(Conflict::Position)) => return Ok(Attempt::PositionMoved),
        Ok(CommitOutcome::Conflict(Conflict::Account)) => return Ok(Attempt::AccountInactive),
        Ok(CommitOutcome::Conflict(_)) => return Ok(Attempt::Retry),
        Err(e) => {
            // The write may have happened: read again; the key says whether it did.
            ctx.set_unsure(e.into());
            return Ok(Attempt::Retry);
        }
        Ok(CommitOutcome::Committed) => {}
    }
    if crate::failpoint::hit("execute.after_commit") {
        // Simulates a crash between the atomic step and the enqueue.
        tracing::error!(action_id = %action_id, "failpoint execute.after_commit: aborting");
        std::process::abort();
    }
    if !in_commit {
        send(&st.dispatch, &key, &owner, &action, now).await?;
    }
    if crate::failpoint::hit("execute.after_send") {
        // Simulates a crash after the send, before the caller hears the answer.
        tracing::error!(action_id = %action_id, "failpoint execute.after_send: aborting");
        std::process::abort();
    }
    Ok(Attempt::Done(ExecuteOutcome::Queued(accepted_action(
        &action,
    ))))
}
