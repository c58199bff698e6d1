//! Steps 5 and 6, shared with the sweeper: send an accepted action's message, then settle
//! its key, only while holding the key's lease; resume an attempt whose lease ended.

use super::*;

/// Steps 5 and 6 of execute, shared with the sweeper: send an accepted action's message,
/// then settle its key, only while holding the key's lease.
#[derive(Clone)]
pub struct Dispatch {
    pub queue: Arc<dyn Queue>,
    pub ledger: Arc<dyn ExecuteLedger>,
}

/// Sends an accepted action's stored message, deduplicated on its id.
pub(crate) async fn send_message(d: &Dispatch, action: &ActionRecord) -> Result<(), ApiError> {
    if crate::failpoint::hit("dispatch.send_fails") {
        return Err(ApiError::unavailable("failpoint dispatch.send_fails"));
    }
    Ok(d.queue
        .send(
            &action.message,
            &action.message.normalized_payload.message_group(),
            &action.action_id,
        )
        .await?)
}

/// Step 5: send the stored message of an action whose key `owner` holds. A send error
/// gives the key back at once (a claim by `owner` whose lease has ended), so the caller's
/// retry with the same key resumes and sends without waiting; if nobody retries, the
/// sweeper sends it. The caller gets 503 with the action's id and `Retry-After`.
pub(crate) async fn send(
    d: &Dispatch,
    key: &KeyRecord,
    owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<(), ApiError> {
    if let Err(e) = send_message(d, action).await {
        if let Err(release) = release_lease(d, key, owner, &action.action_id, now).await {
            tracing::warn!(error = %release, "could not give the key back after a failed send");
        }
        let mut err = ApiError::new(
            Code::UpstreamUnavailable,
            "The action was accepted but could not be queued yet. Retry with the same \
             idempotency key to queue it now; otherwise it is queued within a minute.",
        )
        .with_field(
            "/idempotency_key",
            "the action was accepted but not yet queued; retry with the same key",
        )
        .retry_after(1);
        err.cause = Some(format!(
            "enqueue {}: {}",
            action.action_id,
            e.cause.as_deref().unwrap_or(&e.message)
        ));
        err.action_id = Some(action.action_id.clone());
        return Err(err);
    }
    Ok(())
}

/// A retry or the sweeper holding the lease of a claimed key: send, then decide the key
/// (`queued`, this action) and mark the action sent, only while still holding it.
pub(crate) async fn send_and_finish(
    d: &Dispatch,
    key: &KeyRecord,
    lease_owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<bool, ApiError> {
    send(d, key, lease_owner, action, now).await?;
    mark_sent(d, key, lease_owner, action, now).await
}

/// The key decided as the atomic step decided it (`queued`, this action), and the action
/// marked sent, only while `lease_owner` holds the key.
pub(crate) async fn mark_sent(
    d: &Dispatch,
    key: &KeyRecord,
    lease_owner: &str,
    action: &ActionRecord,
    now: Millis,
) -> Result<bool, ApiError> {
    let mut decided = key.clone();
    decided.state = KeyState::Decided {
        decision: Decision::Queued {
            action_id: action.action_id.clone(),
            plan_id: action.plan_id.clone(),
            queue_target: action.queue_target,
            resource_refs: action.resource_refs.clone(),
        },
        owner: Some(lease_owner.to_string()),
    };
    Ok(d.ledger
        .mark_sent(&decided, lease_owner, &action.action_id, now)
        .await?)
}

/// Moves the lease of a claimed key to `new_owner` until `until`, only if its current
/// owner still holds it (a retry or the sweeper taking over an interrupted execute).
/// `false`: someone else holds it now, or it is decided.
pub(crate) async fn take_lease(
    d: &Dispatch,
    rec: &KeyRecord,
    new_owner: &str,
    until: Millis,
) -> Result<bool, ApiError> {
    let KeyState::Claimed {
        lease_owner,
        action_id,
        ..
    } = &rec.state
    else {
        return Ok(false);
    };
    let mut claim = rec.clone();
    claim.state = KeyState::Claimed {
        lease_owner: new_owner.to_string(),
        lease_until: until,
        action_id: action_id.clone(),
    };
    Ok(d.ledger.take_over(&claim, lease_owner).await?)
}

/// Gives the key of `action_id` back, only while `owner` holds it (its claim, or its
/// decision from the atomic step): a claim whose lease ends now, which whoever comes next
/// (the caller's retry, the sweeper) takes over at once to send the action.
pub(super) async fn release_lease(
    d: &Dispatch,
    key: &KeyRecord,
    owner: &str,
    action_id: &str,
    now: Millis,
) -> Result<bool, ApiError> {
    let mut released = key.clone();
    released.state = KeyState::Claimed {
        lease_owner: owner.to_string(),
        lease_until: now,
        action_id: action_id.to_string(),
    };
    Ok(d.ledger.take_over(&released, owner).await?)
}

/// A key claimed by an attempt that never finished: take its lease and send.
pub(super) async fn resume(
    st: &Executor,
    rec: &KeyRecord,
    action_id: &str,
    request_id: &str,
    now: Millis,
) -> Result<Option<ExecuteOutcome>, ApiError> {
    let new_owner = new_id("lease", now);
    if !take_lease(&st.dispatch, rec, &new_owner, now + st.lease_ms).await? {
        return Ok(None);
    }
    let action =
        st.actions.get_action(action_id).await?.ok_or_else(|| {
            ApiError::internal(format!("claimed action {action_id} has no record"))
        })?;
    send_and_finish(&st.dispatch, rec, &new_owner, &action, now).await?;
    let audit = resent_audit(
        &action,
        &rec.key,
        "a retry with the same idempotency key finished an interrupted execute",
        request_id.to_string(),
        now,
    );
    st.audit.append(&audit).await?;
    Ok(Some(ExecuteOutcome::Queued(accepted_action(&action))))
}

/// The audit record of an action sent late, by a retry or by the sweeper.
pub(crate) fn resent_audit(
    action: &ActionRecord,
    key: &str,
    reason: &str,
    request_id: String,
    now: Millis,
) -> AuditRecord {
    AuditRecord {
        audit_id: new_id("aud", now),
        at: now,
        event: "execute".into(),
        decision: "resent".into(),
        reason_code: None,
        reason: Some(reason.into()),
        action_type: Some(action.action_type),
        plan_id: Some(action.plan_id.clone()),
        action_id: Some(action.action_id.clone()),
        idempotency_key: Some(key.to_string()),
        operator_id: action.requested_by.clone(),
        service_principal: action.service_principal.clone(),
        payload_hash: None,
        risk_checks: Vec::new(),
        order_id: action.resource_refs.order_id.clone(),
        job_id: action.resource_refs.job_id.clone(),
        chat_session_id: action.message.trace.chat_session_id.clone(),
        tool_call_id: action.message.trace.tool_call_id.clone(),
        request_id,
        policy_version: None,
        approver: None,
        credential_id: None,
        user_verified: None,
        apigw_request_id: crate::telemetry::gateway_ids().0,
        lambda_request_id: crate::telemetry::gateway_ids().1,
    }
}
