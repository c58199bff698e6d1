//! The sweeper: actions accepted at the atomic step and still not delivered after
//! `sweep_after_ms` are sent (again). Execute writes nothing after its send, so an action
//! counts as unsent until a worker first moves its status; most of what the sweeper finds
//! was sent and is still waiting in the queue, and the resend is dropped by the queue's
//! deduplication on the action id (or, after its window, by the worker, idempotent on the
//! action id). What it is there for: a crash between the commit and the send (the key is
//! decided: it sends), and a send that failed (the key was given back as an ended claim:
//! it takes the key's lease like any retry, sends and decides the key).
//!
//! An order submission is not sent while the kill switch is engaged: its order is
//! recorded `rejected`, the action `failed` with `kill_switch_engaged: ...`, and the key
//! settled (decided as the atomic step decided, `queued` naming this action) so it leaves
//! the unsent index. An action that is already finished is settled the same way.
//!
//! The scan pages past what it skips (live leases, keys it cannot read): the listing is
//! oldest first and has no cursor, so a full page is followed by a wider one, up to
//! [`MAX_SCAN`] actions a pass, and actions already looked at are not looked at again.

use std::collections::HashSet;
use std::sync::Arc;

use tracing::Instrument;

use crate::core::clock::SharedClock;
use crate::core::domain::{new_id, ActionStatus, Millis};
use crate::core::error::ApiError;
use crate::core::ports::{ActionStore, AuditLog};
use crate::core::usecases::execute::{
    mark_sent, resent_audit, send_and_finish, send_message, take_lease, Dispatch,
};

use super::Worker;
use crate::core::records::{ActionRecord, Decision, KeyRecord, KeyState};

/// The first page of unsent actions; each further page doubles it.
const PAGE: u32 = 100;
/// The most unsent actions one pass looks at.
pub const MAX_SCAN: u32 = 12_800;

/// What the sweeper did with one unsent action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Swept {
    Sent,
    /// Not sent, and no longer unsent: refused under the kill switch, or already finished.
    Settled,
    /// Left for a later pass (a live lease, a key it cannot use).
    Skipped,
}

/// The sweeper, built once per process (`app.rs`): `airlock serve` runs it every
/// `sweep_interval_ms`, the `sweeper` Lambda on a schedule.
#[derive(Clone)]
pub struct Sweeper {
    pub clock: SharedClock,
    /// An action claimed but not sent for this long is sent.
    pub sweep_after_ms: Millis,
    /// How long the sweeper holds a key's lease while it sends.
    pub lease_ms: Millis,
    pub actions: Arc<dyn ActionStore>,
    pub audit: Arc<dyn AuditLog>,
    pub dispatch: Dispatch,
    /// The worker's kill-switch check, applied to order submissions before they are sent.
    pub worker: Arc<Worker>,
}

impl Sweeper {
    /// One pass: the dead-letter sweep ([`super::dead_letters`]), then the unsent actions;
    /// returns how many actions it sent. An action that fails does not stop the pass; the
    /// first error is returned at its end.
    pub async fn sweep_once(&self) -> Result<usize, ApiError> {
        sweep_once(self).await
    }
}

async fn sweep_once(st: &Sweeper) -> Result<usize, ApiError> {
    let now = st.clock.now_ms();
    let before = now - st.sweep_after_ms;
    // Dead letters whose last receive never finished: their actions settled as failed.
    let dead = super::dead_letters::sweep(&st.worker, st.dispatch.queue.as_ref()).await;
    let sent = scan(
        |limit| async move { Ok(st.actions.list_unsent(before, limit).await?) },
        |a: &ActionRecord| a.action_id.clone(),
        |action: ActionRecord| async move {
            let span = tracing::info_span!("sweep", action_id = %action.action_id);
            let swept = sweep_action(st, &action, now).instrument(span).await;
            if matches!(swept, Ok(Swept::Sent)) {
                let queue = action.queue_target.short_name();
                metrics::counter!(crate::metrics::SWEEPER_RESENDS, "queue" => queue).increment(1);
            }
            swept
        },
    )
    .await;
    // The kill switch gauge, once a pass (on Lambda, the only process that reads it on a
    // schedule; `airlock serve` also reads it when `/metrics` is scraped).
    let control = st.worker.control.get_control().await;
    if let Ok(c) = &control {
        let engaged = if c.trade_execute_enabled { 0.0 } else { 1.0 };
        metrics::gauge!(crate::metrics::KILL_SWITCH).set(engaged);
    }
    // An error of any part does not stop the others; the first is returned.
    dead?;
    control?;
    sent
}

/// The scan of one pass: lists unsent actions oldest first, hands each one not seen yet in
/// this pass to `sweep`, and while a page comes back full lists one twice as wide, so
/// whatever `sweep` skips never hides what comes after it (up to [`MAX_SCAN`]). Returns
/// how many were sent, or the first error once every action was tried.
async fn scan<T, L, LF, S, SF>(
    mut list: L,
    id: impl Fn(&T) -> String,
    mut sweep: S,
) -> Result<usize, ApiError>
where
    L: FnMut(u32) -> LF,
    LF: std::future::Future<Output = Result<Vec<T>, ApiError>>,
    S: FnMut(T) -> SF,
    SF: std::future::Future<Output = Result<Swept, ApiError>>,
{
    let mut seen = HashSet::new();
    let (mut sent, mut first_error, mut limit) = (0, None, PAGE);
    loop {
        let page = list(limit).await?;
        let full = page.len() >= limit as usize;
        for item in page {
            let action_id = id(&item);
            if !seen.insert(action_id.clone()) {
                continue;
            }
            match sweep(item).await {
                Ok(Swept::Sent) => sent += 1,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(action_id = %action_id, error = %e, "sweeping an action failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        if !full {
            break;
        }
        if limit >= MAX_SCAN {
            tracing::error!(
                scanned = seen.len(),
                "more unsent actions than one pass looks at; the rest wait for the next"
            );
            break;
        }
        limit = limit.saturating_mul(2).min(MAX_SCAN);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(sent),
    }
}

/// Takes the key's lease of one unsent action, then sends it, or settles it unsent.
async fn sweep_action(st: &Sweeper, action: &ActionRecord, now: Millis) -> Result<Swept, ApiError> {
    let Some(key) = st
        .dispatch
        .ledger
        .get_key(
            &crate::core::records::key_scope(&action.service_principal, &action.requested_by),
            &action.idempotency_key,
            now,
        )
        .await?
    else {
        // Its idempotency record expired (or a real table's TTL deleted it): the action
        // waited unsent for the whole replay window. Too late to act on; never sent.
        return retire(st, action, now).await;
    };
    let (lease_until, action_id) = match &key.state {
        KeyState::Claimed {
            lease_until,
            action_id,
            ..
        } => (lease_until, action_id),
        KeyState::Decided {
            decision: Decision::Queued { action_id, .. },
            ..
        } if *action_id == action.action_id => return sweep_decided(st, &key, action, now).await,
        KeyState::Decided { .. } => {
            tracing::error!("the idempotency record of an unsent action decided otherwise");
            return Ok(Swept::Skipped);
        }
    };
    if *action_id != action.action_id {
        tracing::error!(key_action = %action_id, "the idempotency record names another action");
        return Ok(Swept::Skipped);
    }
    if *lease_until > now {
        return Ok(Swept::Skipped);
    }
    let owner = new_id("sweeper", now);
    if !take_lease(&st.dispatch, &key, &owner, now + st.lease_ms).await? {
        return Ok(Swept::Skipped);
    }
    let held = Some((&key, owner.as_str()));
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        settle(st, held, action, now).await?;
        return Ok(Swept::Settled);
    }
    if action.action_type.is_order_submission() {
        if let Some(why) = super::refuse_unsent_submission(&st.worker, action).await? {
            return refuse(st, held, action, &why, now).await;
        }
    }
    // One audit record per action sent late: only the sender that settles the key writes
    // it (a sweeper that lost the lease meanwhile leaves it to the one that holds it).
    if !send_and_finish(&st.dispatch, &key, &owner, action, now).await? {
        tracing::warn!("lost the key's lease while sending; its holder settles it");
        return Ok(Swept::Skipped);
    }
    resent(st, action, now).await
}

/// An action whose key the atomic step decided, not yet delivered: its send was lost (a
/// crash) or it is still waiting in the queue. Sent again (deduplicated on its id), and
/// taken out of the unsent listing.
async fn sweep_decided(
    st: &Sweeper,
    key: &KeyRecord,
    action: &ActionRecord,
    now: Millis,
) -> Result<Swept, ApiError> {
    if matches!(
        action.status,
        ActionStatus::Succeeded | ActionStatus::Failed
    ) {
        settle(st, None, action, now).await?;
        return Ok(Swept::Settled);
    }
    if action.action_type.is_order_submission() {
        if let Some(why) = super::refuse_unsent_submission(&st.worker, action).await? {
            return refuse(st, None, action, &why, now).await;
        }
    }
    send_message(&st.dispatch, action).await?;
    if !st.actions.clear_unsent(&action.action_id, now).await? {
        // Delivered, or settled by another pass, meanwhile: that one is the record.
        tracing::debug!(idempotency_key = %key.key, "delivered meanwhile");
        return Ok(Swept::Skipped);
    }
    resent(st, action, now).await
}

async fn resent(st: &Sweeper, action: &ActionRecord, now: Millis) -> Result<Swept, ApiError> {
    tracing::warn!("sweeper sent an action not delivered after its execute");
    st.audit
        .append(&resent_audit(
            action,
            &action.idempotency_key,
            "the sweeper sent an action that was accepted but not delivered",
            action.message.trace.request_id.clone(),
            now,
        ))
        .await?;
    Ok(Swept::Sent)
}

/// The kill switch is engaged: the order submission is failed unsent, audited, and its key
/// settled. `held`: the claimed key and the lease the sweeper holds on it, if it is not
/// decided yet.
async fn refuse(
    st: &Sweeper,
    held: Option<(&KeyRecord, &str)>,
    action: &ActionRecord,
    why: &str,
    now: Millis,
) -> Result<Swept, ApiError> {
    st.worker
        .store
        .set_action_status(
            &action.action_id,
            &[ActionStatus::Queued],
            ActionStatus::Failed,
            Some(why),
            now,
        )
        .await?;
    // Failing the action took it out of the unsent listing; a claimed key is decided.
    if held.is_some() {
        settle(st, held, action, now).await?;
    }
    tracing::warn!(reason = %why, "sweeper did not send an order: the kill switch is engaged");
    let mut audit = resent_audit(
        action,
        &action.idempotency_key,
        why,
        action.message.trace.request_id.clone(),
        now,
    );
    audit.decision = "rejected".into();
    audit.reason_code = Some("kill_switch_engaged".into());
    st.audit.append(&audit).await?;
    Ok(Swept::Settled)
}

/// An unsent action whose idempotency record is gone: failed unsent (`expired_unsent`),
/// its order (if any) rejected, taken out of the unsent listing, audited.
async fn retire(st: &Sweeper, action: &ActionRecord, now: Millis) -> Result<Swept, ApiError> {
    let why = format!(
        "{EXPIRED_UNSENT}: not sent within the {} h replay window of its idempotency key",
        crate::core::usecases::execute::REPLAY_WINDOW_MS / 3_600_000
    );
    if !super::reject_unsent_order(&st.worker, action).await? {
        // A worker has its order: it was sent after all.
        return Ok(Swept::Skipped);
    }
    // Moving the status takes it out of the unsent listing.
    let moved = st
        .worker
        .store
        .set_action_status(
            &action.action_id,
            &[ActionStatus::Queued],
            ActionStatus::Failed,
            Some(&why),
            now,
        )
        .await?;
    if !moved {
        // A worker moved it meanwhile: it was delivered after all.
        st.actions.clear_unsent(&action.action_id, now).await?;
        return Ok(Swept::Settled);
    }
    tracing::error!(reason = %why, "sweeper retired an action never sent");
    let mut audit = resent_audit(
        action,
        &action.idempotency_key,
        &why,
        action.message.trace.request_id.clone(),
        now,
    );
    audit.decision = "rejected".into();
    audit.reason_code = Some(EXPIRED_UNSENT.into());
    st.audit.append(&audit).await?;
    Ok(Swept::Settled)
}

/// The reason code of an action the sweeper retired unsent.
pub const EXPIRED_UNSENT: &str = "expired_unsent";

/// Takes a finished or refused action out of the unsent listing without sending it: a
/// claimed key (`held`, with the sweeper's lease) is decided as the atomic step decided
/// (`queued`, this action), so a retry of the key replays that decision, and the action's
/// own status says how it ended.
async fn settle(
    st: &Sweeper,
    held: Option<(&KeyRecord, &str)>,
    action: &ActionRecord,
    now: Millis,
) -> Result<(), ApiError> {
    let done = match held {
        Some((key, owner)) => mark_sent(&st.dispatch, key, owner, action, now).await?,
        None => st.actions.clear_unsent(&action.action_id, now).await?,
    };
    if !done {
        tracing::warn!("the action changed before it was settled; a later pass will look again");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A store of unsent actions `(created_at, id)`, listed oldest first; sent ones leave.
    struct Unsent(RefCell<Vec<(i64, String)>>);

    impl Unsent {
        fn new(n: usize) -> Self {
            Unsent(RefCell::new(
                (0..n).map(|i| (i as i64, format!("act-{i:05}"))).collect(),
            ))
        }
        async fn list(&self, limit: u32) -> Result<Vec<(i64, String)>, ApiError> {
            let all = self.0.borrow();
            Ok(all.iter().take(limit as usize).cloned().collect())
        }
        fn remove(&self, id: &str) {
            self.0.borrow_mut().retain(|(_, i)| i != id);
        }
    }

    /// 250 unsent actions, the oldest 230 of which the sweeper must skip (live leases,
    /// unreadable keys): the 20 after them are still sent, in one pass, each looked at once.
    #[tokio::test]
    async fn skipped_actions_do_not_hide_later_ones() {
        let store = Unsent::new(250);
        let looked = RefCell::new(Vec::new());
        let sent = scan(
            |limit| store.list(limit),
            |a: &(i64, String)| a.1.clone(),
            |a: (i64, String)| {
                looked.borrow_mut().push(a.1.clone());
                let skip = a.0 < 230;
                if !skip {
                    store.remove(&a.1);
                }
                async move { Ok(if skip { Swept::Skipped } else { Swept::Sent }) }
            },
        )
        .await
        .unwrap();
        assert_eq!(sent, 20);
        assert_eq!(looked.borrow().len(), 250, "each action looked at once");
        assert_eq!(
            store.0.borrow().len(),
            230,
            "only the skipped ones are left"
        );
    }

    /// An error on one action does not stop the pass; it is reported at the end.
    #[tokio::test]
    async fn one_failing_action_does_not_stop_the_pass() {
        let store = Unsent::new(3);
        let result = scan(
            |limit| store.list(limit),
            |a: &(i64, String)| a.1.clone(),
            |a: (i64, String)| {
                let fail = a.0 == 0;
                if !fail {
                    store.remove(&a.1);
                }
                async move {
                    match fail {
                        true => Err(ApiError::unavailable("queue down")),
                        false => Ok(Swept::Sent),
                    }
                }
            },
        )
        .await;
        assert!(result.is_err());
        assert_eq!(store.0.borrow().len(), 1, "the other two were sent");
    }

    /// The scan stops at [`MAX_SCAN`] actions a pass, whatever is left.
    #[tokio::test]
    async fn a_pass_looks_at_most_at_max_scan_actions() {
        let store = Unsent::new(MAX_SCAN as usize + 500);
        let mut looked = 0;
        let sent = scan(
            |limit| store.list(limit),
            |a: &(i64, String)| a.1.clone(),
            |_| {
                looked += 1;
                async { Ok(Swept::Skipped) }
            },
        )
        .await
        .unwrap();
        assert_eq!((sent, looked), (0, MAX_SCAN as usize));
    }
}
