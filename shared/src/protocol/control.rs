//! The kill switch and rollout modes. Writes go straight to the control record; execute
//! reads it inside its atomic step, so a change takes effect on the next execute.

use crate::error::StoreResult;
use crate::ports::ControlStore;
use crate::records::{Control, RolloutMode};

pub async fn engage(
    store: &dyn ControlStore,
    who: &str,
    reason: Option<String>,
    now: i64,
) -> StoreResult<Control> {
    let mut c = store.get_control().await?;
    c.trade_execute_enabled = false;
    c.updated_at = now;
    c.updated_by = who.into();
    c.reason = reason;
    store.put_control(&c).await?;
    Ok(c)
}

pub async fn release(store: &dyn ControlStore, who: &str, now: i64) -> StoreResult<Control> {
    let mut c = store.get_control().await?;
    c.trade_execute_enabled = true;
    c.updated_at = now;
    c.updated_by = who.into();
    c.reason = None;
    store.put_control(&c).await?;
    Ok(c)
}

pub async fn set_rollout(
    store: &dyn ControlStore,
    action_type: &str,
    mode: RolloutMode,
    who: &str,
    now: i64,
) -> StoreResult<Control> {
    let mut c = store.get_control().await?;
    c.rollout.insert(action_type.to_string(), mode);
    c.updated_at = now;
    c.updated_by = who.into();
    store.put_control(&c).await?;
    Ok(c)
}
