//! The execute ledger on SQLite: idempotency keys, the rate state, and the execute commit.
//! `commit` checks every condition of an [`ExecuteCommit`] inside one IMMEDIATE
//! transaction and writes all or nothing, the embedded twin of DynamoDB's
//! `TransactWriteItems`. The embedded queue is a table of the same database, so the
//! commit also queues the accepted action's message (a transactional outbox): there is no
//! window between the decision and the send on this backend.

use super::audit::AuditRow;
use super::control::load_control;
use super::packed::packed_json;
use super::plans::{load_plan, set_plan_fields};
use super::positions::{add_open, load_exposure};
use super::rows::one_body;
use super::rows::Cached;
use super::{db_err, json_err, Sqlite};
use crate::core::error::StoreResult;
use crate::core::ports::{
    CommitOutcome, Conflict, ExecuteCommit, ExecuteLedger, ExecuteSnapshot, KeyCondition,
    PlanChange,
};
use crate::core::records::{KeyRecord, PlanStatus, RateState, RateUpdate};
use crate::core::throttle::MessageWindow;
use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};

pub(super) fn load_key(
    c: &Connection,
    principal: &str,
    key: &str,
    now: i64,
) -> StoreResult<Option<KeyRecord>> {
    one_body(
        c,
        "SELECT body FROM idempotency_keys WHERE principal = ? AND key = ? AND expires_at > ?",
        &[&principal, &key, &now],
    )?
    .map(|t| serde_json::from_str(&t).map_err(json_err))
    .transpose()
}

pub(super) fn put_key(c: &Connection, k: &KeyRecord) -> StoreResult<()> {
    put_key_body(c, k, &packed_json(k)?)
}

/// [`put_key`] with the body already serialized and packed (`body` is `k`).
fn put_key_body(c: &Connection, k: &KeyRecord, body: &[u8]) -> StoreResult<()> {
    c.prepare_cached(
        "INSERT OR REPLACE INTO idempotency_keys (principal, key, lease_owner, expires_at, body) \
         VALUES (?, ?, ?, ?, ?)",
    )
    .and_then(|mut st| st.execute(params![k.principal, k.key, k.owner(), k.expires_at, body]))
    .map_err(db_err)?;
    Ok(())
}

pub(super) fn load_rate(c: &Connection, operator: &str) -> StoreResult<RateState> {
    Ok(rate_limits_row(c, operator)?.unwrap_or_else(|| RateState {
        operator_id: operator.to_string(),
        ..RateState::default()
    }))
}

/// Writes the rate-limits table's row `id`: its `version` column and `body` as JSON.
pub(super) fn put_rate_limits_row(
    tx: &Connection,
    id: &str,
    version: i64,
    body: &impl serde::Serialize,
) -> StoreResult<()> {
    let text = serde_json::to_string(body).map_err(json_err)?;
    tx.run(
        "INSERT OR REPLACE INTO rate_limits (operator_id, version, body) VALUES (?, ?, ?)",
        params![id, version, text],
    )
    .map_err(db_err)?;
    Ok(())
}

/// The body of the rate-limits table's row `id`, as `T` (`None` when there is no row).
pub(super) fn rate_limits_row<T: serde::de::DeserializeOwned>(
    c: &Connection,
    id: &str,
) -> StoreResult<Option<T>> {
    one_body(
        c,
        "SELECT body FROM rate_limits WHERE operator_id = ?",
        &[&id],
    )?
    .map(|t| serde_json::from_str(&t).map_err(json_err))
    .transpose()
}

/// Whether the stored window still allows the update: below its cap in the same minute, or
/// still at the minute it rolls over from (the condition of [`RateUpdate`]).
pub(super) fn rate_allows(c: &Connection, u: &RateUpdate) -> StoreResult<bool> {
    let stored = load_rate(c, &u.operator_id)?;
    Ok(if u.is_increment() {
        stored.bucket == u.bucket && stored.count < u.cap
    } else {
        stored.bucket == u.expected_bucket
    })
}

/// Counts one more under the update (its condition checked by [`rate_allows`]).
pub(super) fn count_rate(tx: &Connection, u: &RateUpdate) -> StoreResult<()> {
    let mut state = load_rate(tx, &u.operator_id)?;
    if u.is_increment() {
        state.count += 1;
    } else {
        state = RateState {
            operator_id: u.operator_id.clone(),
            bucket: u.bucket,
            count: 1,
            previous: u.previous,
        };
    }
    put_rate_limits_row(tx, &state.operator_id, state.bucket, &state)
}

/// An account's message window (empty when none is stored), a row of the rate-limits table.
pub(super) fn load_messages(c: &Connection, id: &str) -> StoreResult<MessageWindow> {
    Ok(rate_limits_row(c, id)?.unwrap_or_else(|| MessageWindow {
        id: id.to_string(),
        ..MessageWindow::default()
    }))
}

pub(super) fn put_messages(tx: &Connection, w: &MessageWindow) -> StoreResult<()> {
    put_rate_limits_row(tx, &w.id, w.bucket, w)
}

/// Checks every condition of `commit`; `Some(conflict)` means nothing may be written.
pub(super) fn check(
    tx: &Connection,
    commit: &ExecuteCommit,
    now: i64,
) -> StoreResult<Option<Conflict>> {
    // The key's owner column (`KeyRecord::owner`), without parsing its body.
    let existing: Option<Option<String>> = tx
        .row(
            "SELECT lease_owner FROM idempotency_keys \
             WHERE principal = ? AND key = ? AND expires_at > ?",
            params![commit.key.principal, commit.key.key, now],
            |r| r.get(0),
        )
        .optional()
        .map_err(db_err)?;
    let key_ok = match (&commit.key_condition, &existing) {
        (KeyCondition::Absent, None) => true,
        (KeyCondition::ClaimedBy(owner), Some(held)) => held.as_deref() == Some(owner.as_str()),
        _ => false,
    };
    if !key_ok {
        return Ok(Some(Conflict::Key));
    }
    if let Some((plan_id, _)) = &commit.plan_change {
        let status: Option<String> = tx
            .prepare_cached("SELECT status FROM plans WHERE plan_id = ?")
            .and_then(|mut st| st.query_row([plan_id], |r| r.get(0)).optional())
            .map_err(db_err)?;
        if status.as_deref() != Some("planned") {
            return Ok(Some(Conflict::Plan));
        }
    }
    if let Some(version) = commit.control_version {
        // The version alone, read by SQLite (the body holds the whole policy).
        let stored: Option<Option<u64>> = tx
            .row(
                "SELECT json_extract(body, '$.version') FROM control WHERE id = 1",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)?;
        if stored
            .flatten()
            .unwrap_or(crate::core::records::Control::default().version)
            != version
        {
            return Ok(Some(Conflict::Control));
        }
    }
    if let Some(account_id) = &commit.account_active {
        let status: Option<String> = tx
            .prepare_cached("SELECT status FROM accounts WHERE account_id = ?")
            .and_then(|mut st| st.query_row([account_id], |r| r.get(0)).optional())
            .map_err(db_err)?;
        if status.as_deref() != Some("active") {
            return Ok(Some(Conflict::Account));
        }
    }
    if let Some(u) = &commit.rate {
        if !rate_allows(tx, u)? {
            return Ok(Some(Conflict::Rate));
        }
    }
    if let Some(u) = &commit.messages {
        if !u.allowed_by(&load_messages(tx, &u.id)?) {
            return Ok(Some(Conflict::Messages));
        }
    }
    if let Some(r) = &commit.reserve {
        let e = load_exposure(tx, &r.delta.account_id, &r.delta.symbol)?;
        if !r.fits(&e) {
            return Ok(Some(Conflict::Position));
        }
    }
    Ok(None)
}

#[async_trait]
impl ExecuteLedger for Sqlite {
    async fn get_key(
        &self,
        principal: &str,
        key: &str,
        now: i64,
    ) -> StoreResult<Option<KeyRecord>> {
        let (p, k) = (principal.to_string(), key.to_string());
        self.read(move |c| load_key(c, &p, &k, now)).await
    }

    async fn snapshot(
        &self,
        principal: &str,
        key: &str,
        plan_id: &str,
        operator_id: &str,
        now: i64,
    ) -> StoreResult<ExecuteSnapshot> {
        let (p, k, plan, op) = (
            principal.to_string(),
            key.to_string(),
            plan_id.to_string(),
            operator_id.to_string(),
        );
        self.read(move |c| {
            // One read transaction: a consistent view of all four.
            c.execute_batch("BEGIN").map_err(db_err)?;
            let snap = (|| {
                Ok(ExecuteSnapshot {
                    key: load_key(c, &p, &k, now)?,
                    plan: load_plan(c, &plan)?,
                    control: load_control(c)?,
                    rate: load_rate(c, &op)?,
                })
            })();
            c.execute_batch("COMMIT").map_err(db_err)?;
            snap
        })
        .await
    }

    async fn commit(&self, commit: &ExecuteCommit, now: i64) -> StoreResult<CommitOutcome> {
        // Every record is serialized and packed here, off the writer thread; only SQL runs
        // on it.
        let key_body = packed_json(&commit.key)?;
        let action_body = commit.action.as_ref().map(packed_json).transpose()?;
        let audit = AuditRow::new(&commit.audit)?;
        // The plan's change, as the fields it sets in the stored body.
        let plan_change = commit.plan_change.as_ref().map(|(plan_id, change)| {
            let (status, field, value) = match change {
                PlanChange::Execute { action_id } => {
                    (PlanStatus::Executed, "action_id", action_id.clone())
                }
                PlanChange::Close { reason_code } => {
                    (PlanStatus::Closed, "closed_reason", reason_code.clone())
                }
            };
            let status = serde_json::to_value(status)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            (plan_id.clone(), status, field, value)
        });
        // The outbox: the action's message, queued by this same transaction.
        let outbox = match (&commit.enqueue_group, &commit.action) {
            (Some(group), Some(a)) => {
                Some((a.queue_target, group.clone(), packed_json(&a.message)?))
            }
            _ => None,
        };
        let queued = outbox.as_ref().map(|(target, ..)| *target);
        let commit = commit.clone();
        let outcome = self
            .write(move |tx| {
                if let Some(conflict) = check(tx, &commit, now)? {
                    return Ok(CommitOutcome::Conflict(conflict));
                }
                put_key_body(tx, &commit.key, &key_body)?;
                if let Some((plan_id, status, field, value)) = &plan_change {
                    if !set_plan_fields(tx, plan_id, status, field, value)? {
                        return Err(crate::core::error::StoreError::Corrupt(
                            "plan vanished".into(),
                        ));
                    }
                }
                if let Some(u) = &commit.rate {
                    count_rate(tx, u)?;
                }
                if let Some(r) = &commit.reserve {
                    add_open(tx, &r.delta)?;
                }
                if let Some(u) = &commit.messages {
                    put_messages(tx, &u.applied_to(&load_messages(tx, &u.id)?))?;
                }
                if let (Some(a), Some(body)) = (&commit.action, &action_body) {
                    tx.run(
                        "INSERT INTO actions (action_id, plan_id, enqueued_at, created_at, body) \
                     VALUES (?, ?, ?, ?, ?)",
                        params![a.action_id, a.plan_id, a.enqueued_at, a.created_at, body],
                    )
                    .map_err(db_err)?;
                }
                if let (Some((target, group, body)), Some(a)) = (&outbox, &commit.action) {
                    let sent_at = chrono::Utc::now().timestamp_millis();
                    super::queue::insert(tx, target.as_str(), group, &a.action_id, body, sent_at)?;
                }
                audit.insert(tx)?;
                Ok(CommitOutcome::Committed)
            })
            .await?;
        if let (CommitOutcome::Committed, Some(target)) = (outcome, queued) {
            self.wake(target);
        }
        Ok(outcome)
    }

    fn queues_in_commit(&self) -> bool {
        true
    }

    async fn mark_sent(
        &self,
        decided: &KeyRecord,
        lease_owner_id: &str,
        action_id: &str,
        now: i64,
    ) -> StoreResult<bool> {
        let (decided, owner, action_id) = (
            decided.clone(),
            lease_owner_id.to_string(),
            action_id.to_string(),
        );
        self.write(move |tx| {
            let held = load_key(tx, &decided.principal, &decided.key, now)?;
            if held.as_ref().and_then(KeyRecord::owner) != Some(owner.as_str()) {
                return Ok(false);
            }
            let Some(action_text) = one_body(
                tx,
                "SELECT body FROM actions WHERE action_id = ?",
                &[&action_id],
            )?
            else {
                return Ok(false);
            };
            put_key(tx, &decided)?;
            let mut action: crate::core::records::ActionRecord =
                serde_json::from_str(&action_text).map_err(json_err)?;
            if action.enqueued_at.is_none() {
                action.enqueued_at = Some(now);
                action.updated_at = action.updated_at.max(now);
                let body = packed_json(&action)?;
                tx.run(
                    "UPDATE actions SET enqueued_at = ?, body = ? WHERE action_id = ?",
                    params![now, body, action.action_id],
                )
                .map_err(db_err)?;
            }
            Ok(true)
        })
        .await
    }

    async fn take_over(&self, claim: &KeyRecord, old_owner: &str) -> StoreResult<bool> {
        let (claim, old) = (claim.clone(), old_owner.to_string());
        self.write(move |tx| {
            let held = load_key(tx, &claim.principal, &claim.key, i64::MIN)?;
            if held.as_ref().and_then(KeyRecord::owner) != Some(old.as_str()) {
                return Ok(false);
            }
            put_key(tx, &claim)?;
            Ok(true)
        })
        .await
    }
}
