//! One message's processing: the action moves to `processing`, its type's module claims
//! what it needs and does its step, and the action is settled with the outcome.

use super::*;
use crate::core::records::QUEUE_MESSAGE_SCHEMA;
use crate::core::usecases::actions;

pub(super) async fn process(st: &Worker, body: &str) -> Result<Outcome, ApiError> {
    let received: QueueMessage =
        serde_json::from_str(body).map_err(|e| bad_message(e.to_string()))?;
    if received.schema != QUEUE_MESSAGE_SCHEMA {
        return Err(bad_message(format!("unknown schema {}", received.schema)));
    }
    let action = match stored_action(st, &received).await? {
        Ok(action) => action,
        Err(why) => return Ok(refuse(&received.action_id, why)),
    };
    // From here on only the stored message counts: what was approved at execute.
    let msg = &action.message;
    if crate::failpoint::hit("worker.poison") && msg.trace.tool_call_id.as_deref() == Some("poison")
    {
        // Test-only: a message that fails every time it is handled.
        return Err(ApiError::internal(
            "failpoint worker.poison: this message cannot be handled",
        ));
    }
    if crate::failpoint::hit("worker.panic") && msg.trace.tool_call_id.as_deref() == Some("panic") {
        // Test-only: a message whose handling panics every time.
        panic!("failpoint worker.panic: this message panics");
    }
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        return Ok(Outcome::AlreadyDone);
    }
    let now = st.clock.now_ms();
    // The action moves to `processing`; an order submission's order is created, claimed
    // for the broker, beside it: two independent writes side by side (on SQLite the writer
    // commits them together).
    let processing = async {
        st.store
            .set_action_status(
                &msg.action_id,
                &[ActionStatus::Queued],
                ActionStatus::Processing,
                None,
                now,
            )
            .await
            .map_err(ApiError::from)
    };
    let action_module = actions::of(msg.action_type);
    let claim = action_module.claim(st, msg, now);
    let (_, claimed) = tokio::try_join!(processing, claim)?;
    if crate::failpoint::hit("worker.slow") && msg.trace.tool_call_id.as_deref() == Some("slow") {
        // Test-only: a message whose handling takes 6 s (a slow broker, say).
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    }
    // `settled`: the action was settled with the order's record, in the same write.
    let (outcome, settled) = action_module.work(st, msg, claimed).await?;
    let settled_at = st.clock.now_ms();
    if !settled {
        let m = settle(msg, &outcome, settled_at);
        st.store
            .set_action_status(m.action_id, m.from, m.to, m.error, m.at)
            .await?;
    }
    if msg.action_type.is_order_submission() {
        // Accept (the execute) to the order's first terminal answer from this worker.
        metrics::histogram!(crate::metrics::ORDER_LATENCY)
            .record((settled_at - action.created_at).max(0) as f64 / 1000.0);
    }
    Ok(outcome)
}

/// The action's move to the status `outcome` gives it.
pub(super) fn settle<'a>(
    msg: &'a QueueMessage,
    outcome: &'a Outcome,
    at: Millis,
) -> ActionMove<'a> {
    let (to, error) = match outcome {
        Outcome::Failed(why) => (ActionStatus::Failed, Some(why.as_str())),
        _ => (ActionStatus::Succeeded, None),
    };
    ActionMove {
        action_id: &msg.action_id,
        from: &UNSETTLED,
        to,
        error,
        at,
    }
}
