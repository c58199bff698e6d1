//! The message throttle at execute ([`crate::core::throttle`]): an order, a change or a
//! cancel is counted on its account's window by the commit; an order or a change over the
//! threshold, or during the account's lockout, is refused. A refusal is not a decision:
//! nothing is recorded on the key or the plan, so the same execute passes after the
//! lockout. A sync is no message to the exchange and is not counted.

use super::*;
use crate::core::throttle::{window_id, Gate, MessageUpdate, Throttle};

/// The update the commit counts the message with (`None`: not a message), or the refusal,
/// audited (and the lockout it starts, stored).
pub(super) async fn messages(
    ctx: &Ctx<'_>,
    plan: &PlanRecord,
    control: &Control,
    now: Millis,
) -> Result<Option<MessageUpdate>, ApiError> {
    if plan.action_type.queue_target() != QueueTarget::Orders {
        return Ok(None);
    }
    let st = ctx.state;
    let throttle = Throttle::of(policy::in_force(&st.policy, control));
    let id = window_id(&plan.account_id);
    let window = st.limits.messages(&id).await?;
    let cancel = plan.action_type == ActionType::OrderCancel;
    match throttle.gate(&window, now, cancel) {
        Gate::Pass(update) => Ok(Some(update)),
        Gate::Refuse(refusal) => {
            if let Some(until) = refusal.starts_lockout {
                let keep = until + 2 * throttle.window_ms + 60_000;
                st.limits.lock_messages(&id, until, keep).await?;
                metrics::counter!(LOCKOUTS).increment(1);
            }
            let e = throttle.refusal(&plan.account_id, now, &refusal);
            Err(ctx.reject(e, Some(plan)).await)
        }
    }
}

/// `airlock_message_lockouts_total`: lockouts started by the message throttle.
pub const LOCKOUTS: &str = "airlock_message_lockouts_total";
