//! The sweeper: actions accepted at the atomic step but never sent (a crash between the
//! commit and the enqueue, and nobody retried) are sent after `sweep_after_ms`. It takes
//! the key's lease like any retry, so it never races a live attempt.

use crate::app::AppState;
use crate::domain::new_id;
use crate::error::ApiError;
use crate::protocol::execute::send_and_finish;
use crate::records::{AuditRecord, KeyState};

/// One pass; returns how many actions it sent.
pub async fn sweep_once(st: &AppState) -> Result<usize, ApiError> {
    let now = st.clock.now_ms();
    let unsent = st
        .ports
        .actions
        .list_unsent(now - st.config.sweep_after_ms, 100)
        .await?;
    let mut sent = 0;
    for action in unsent {
        let Some(key) = st
            .ports
            .ledger
            .get_key(&action.service_principal, &action.idempotency_key, i64::MIN)
            .await?
        else {
            tracing::error!(action_id = %action.action_id, "unsent action has no idempotency record");
            continue;
        };
        let KeyState::Claimed {
            lease_owner,
            lease_until,
            ..
        } = &key.state
        else {
            continue;
        };
        if *lease_until > now {
            continue;
        }
        let owner = new_id("sweeper", now);
        if !st
            .ports
            .ledger
            .take_over(
                &key.principal,
                &key.key,
                lease_owner,
                &owner,
                now + st.config.execute_lease_ms,
            )
            .await?
        {
            continue;
        }
        send_and_finish(st, &key, &owner, &action, now).await?;
        sent += 1;
        tracing::warn!(action_id = %action.action_id, "sweeper sent an action left unsent");
        st.ports
            .audit
            .append(&AuditRecord {
                audit_id: new_id("aud", now),
                at: now,
                event: "execute".into(),
                decision: "resent".into(),
                reason_code: None,
                reason: Some(
                    "the sweeper sent an action that was accepted but never queued".into(),
                ),
                action_type: Some(action.action_type),
                plan_id: Some(action.plan_id.clone()),
                action_id: Some(action.action_id.clone()),
                idempotency_key: Some(key.key.clone()),
                operator_id: action.requested_by.clone(),
                service_principal: action.service_principal.clone(),
                payload_hash: None,
                risk_checks: Vec::new(),
                order_id: action.resource_refs.order_id.clone(),
                job_id: action.resource_refs.job_id.clone(),
                chat_session_id: action.message.trace.chat_session_id.clone(),
                tool_call_id: action.message.trace.tool_call_id.clone(),
                request_id: action.message.trace.request_id.clone(),
                policy_version: None,
            })
            .await?;
    }
    Ok(sent)
}
