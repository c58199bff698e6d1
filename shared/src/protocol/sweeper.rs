//! The sweeper: actions accepted at the atomic step but never sent (a crash between the
//! commit and the enqueue, and nobody retried) are sent after `sweep_after_ms`. It takes
//! the key's lease like any retry, so it never races a live attempt.

use crate::app::AppState;
use crate::domain::new_id;
use crate::error::ApiError;
use crate::protocol::execute::{resent_audit, send_and_finish};
use crate::records::KeyState;

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
            .append(&resent_audit(
                &action,
                &key.key,
                "the sweeper sent an action that was accepted but never queued",
                action.message.trace.request_id.clone(),
                now,
            ))
            .await?;
    }
    Ok(sent)
}
