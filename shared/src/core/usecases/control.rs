//! The kill switch, rollout modes and the risk policy in the control record. Every write
//! reads the record, changes one thing, and writes it back only if nobody wrote in between
//! (a conditional write on the version read), else reads again: a `rollout` racing an
//! `engage` can never write `trade_execute_enabled = true` back. Execute conditions its
//! commit on the version it decided on, so a change takes effect on the next execute.

use crate::core::error::{StoreError, StoreResult};
use crate::core::policy::Policy;
use crate::core::ports::ControlStore;
use crate::core::records::{Control, RolloutMode};

const ROUNDS: usize = 32;

/// Applies `change` to the current record and writes it at the version read; on a
/// concurrent write, reads again and applies `change` to the newer record.
pub async fn update(
    store: &dyn ControlStore,
    who: &str,
    now: i64,
    change: impl Fn(&mut Control),
) -> StoreResult<Control> {
    for _ in 0..ROUNDS {
        let mut c = store.get_control().await?;
        let read = c.version;
        change(&mut c);
        c.updated_at = now;
        c.updated_by = who.into();
        c.version = read + 1;
        if store.put_control(&c, read).await? {
            return Ok(c);
        }
    }
    Err(StoreError::Unavailable(
        "control record: too many concurrent writes".into(),
    ))
}

/// Engages the kill switch: a released switch starts a new engagement
/// ([`Control::engage`]), an engaged one keeps its own.
pub async fn engage(
    store: &dyn ControlStore,
    who: &str,
    reason: Option<String>,
    now: i64,
) -> StoreResult<Control> {
    let id = crate::core::domain::new_id("ks", now);
    update(store, who, now, |c| c.engage(&id, now, who, reason.clone())).await
}

pub async fn release(store: &dyn ControlStore, who: &str, now: i64) -> StoreResult<Control> {
    update(store, who, now, |c| {
        c.trade_execute_enabled = true;
        c.reason = None;
    })
    .await
}

pub async fn set_rollout(
    store: &dyn ControlStore,
    action_type: &str,
    mode: RolloutMode,
    who: &str,
    now: i64,
) -> StoreResult<Control> {
    update(store, who, now, |c| {
        c.rollout.insert(action_type.to_string(), mode);
    })
    .await
}

/// Sets the policy in the control record (`None`: back to the process's own).
pub async fn set_policy(
    store: &dyn ControlStore,
    policy: Option<Policy>,
    who: &str,
    now: i64,
) -> StoreResult<Control> {
    update(store, who, now, |c| c.policy = policy.clone()).await
}
