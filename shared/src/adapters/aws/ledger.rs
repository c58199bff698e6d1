//! The execute ledger on DynamoDB: idempotency keys, the rate state, and the execute commit
//! as one `TransactWriteItems` whose cancellation reasons name the condition that failed.

use super::actions::action_put;
use super::audit::audit_put;
use super::control::{control_from_item, control_shard, CONTROL_ID};
use super::ddb::{self, idempotency_pk, n, opt_s, s, Item};
use super::plans::plan_from_item;
use super::tables::{built, put_and_update};
use super::{unavailable, Aws, ConditionFailure, Names};
use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{
    CommitOutcome, Conflict, ExecuteCommit, ExecuteLedger, ExecuteSnapshot, KeyCondition,
    PlanChange,
};
use crate::core::records::{KeyRecord, RateState, RateUpdate};
use crate::core::throttle::{MessageUpdate, MessageWindow};
use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, KeysAndAttributes, Put, TransactWriteItem, Update};
use std::collections::HashMap;

pub(super) fn key_item(k: &KeyRecord) -> StoreResult<Item> {
    let mut item: Item = HashMap::from([
        ("pk".to_string(), s(idempotency_pk(&k.principal, &k.key))),
        ("expires_at".to_string(), n(k.expires_at)),
        ("ttl".to_string(), ddb::ttl_seconds(k.expires_at)),
        ("body".to_string(), ddb::body(k)?),
    ]);
    if let Some(owner) = k.owner() {
        item.insert("lease_owner".into(), s(owner));
    }
    Ok(item)
}

pub(super) fn key_from_item(item: &Item, now: Millis) -> StoreResult<Option<KeyRecord>> {
    // TTL deletion is lazy: an expired record counts as absent.
    match ddb::opt_n(item, "expires_at") {
        Some(exp) if exp > now => ddb::from_body(item).map(Some),
        _ => Ok(None),
    }
}

/// A rate window as stored under `id` (absent: empty).
pub(super) fn rate_from_item(id: &str, item: Option<&Item>) -> RateState {
    RateState {
        operator_id: id.to_string(),
        ..match item {
            Some(i) => RateState {
                operator_id: String::new(),
                bucket: ddb::opt_n(i, "bucket").unwrap_or(0),
                count: ddb::opt_n(i, "count").unwrap_or(0) as u32,
                previous: ddb::opt_n(i, "previous").unwrap_or(0) as u32,
            },
            None => RateState::default(),
        }
    }
}

/// One more in a rate window, as DynamoDB expressions: an increment below the cap in the
/// same minute, or a roll-over to the current minute from the bucket read. The same
/// expressions serve execute's transaction and a single `UpdateItem` (the plan rate).
pub(super) struct RateExpr {
    pub key: Item,
    pub update: &'static str,
    pub condition: &'static str,
    pub names: HashMap<String, String>,
    pub values: Item,
}

impl RateExpr {
    pub fn of(u: &RateUpdate) -> RateExpr {
        let names = HashMap::from([
            ("#c".to_string(), "count".to_string()),
            ("#b".to_string(), "bucket".to_string()),
            ("#ttl".to_string(), "ttl".to_string()),
        ]);
        let mut values: Item = HashMap::from([
            (":b".to_string(), n(u.bucket)),
            (
                ":ttl".to_string(),
                n((u.bucket + 3 * 60_000).div_euclid(1000)),
            ),
            (":one".to_string(), n(1)),
        ]);
        let (update, condition) = if u.is_increment() {
            values.insert(":cap".into(), n(u.cap as i64));
            ("SET #c = #c + :one, #ttl = :ttl", "#b = :b AND #c < :cap")
        } else {
            values.insert(":prev".into(), n(u.previous as i64));
            values.insert(":old".into(), n(u.expected_bucket));
            (
                "SET #b = :b, #c = :one, previous = :prev, #ttl = :ttl",
                "attribute_not_exists(operator_id) OR #b = :old",
            )
        };
        RateExpr {
            key: HashMap::from([("operator_id".to_string(), s(u.operator_id.clone()))]),
            update,
            condition,
            names,
            values,
        }
    }
}

/// An account's message window as stored under `id` (absent: empty).
pub(super) fn messages_from_item(id: &str, item: Option<&Item>) -> MessageWindow {
    let num = |k: &str| item.and_then(|i| ddb::opt_n(i, k)).unwrap_or(0);
    MessageWindow {
        id: id.to_string(),
        bucket: num("bucket"),
        count: num("count").clamp(0, u32::MAX as i64) as u32,
        previous: num("previous").clamp(0, u32::MAX as i64) as u32,
        locked_until: num("locked_until"),
    }
}

/// One more message on an account's window, as the DynamoDB update of execute's
/// transaction: the rate window's increment or roll-over ([`RateExpr`]), below the cap
/// when there is one, and only while the account is not locked out when that is asked.
fn messages_update(table: &str, u: &MessageUpdate) -> StoreResult<Update> {
    let mut up = Update::builder()
        .table_name(table)
        .key("operator_id", s(u.id.clone()))
        .expression_attribute_names("#c", "count")
        .expression_attribute_names("#b", "bucket")
        .expression_attribute_names("#ttl", "ttl")
        .expression_attribute_values(":b", n(u.bucket))
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":ttl", ddb::ttl_seconds(u.keep_until));
    let mut condition = if u.is_increment() {
        up = up.update_expression("SET #c = #c + :one, #ttl = :ttl");
        match u.cap {
            Some(cap) => {
                up = up.expression_attribute_values(":cap", n(cap as i64));
                "#b = :b AND #c < :cap".to_string()
            }
            None => "#b = :b".to_string(),
        }
    } else {
        up = up
            .update_expression("SET #b = :b, #c = :one, previous = :prev, #ttl = :ttl")
            .expression_attribute_values(":prev", n(u.previous as i64))
            .expression_attribute_values(":old", n(u.expected_bucket));
        "(attribute_not_exists(#b) OR #b = :old)".to_string()
    };
    if let Some(now) = u.unlocked_at {
        up = up
            .expression_attribute_names("#lu", "locked_until")
            .expression_attribute_values(":now", n(now));
        condition.push_str(" AND (attribute_not_exists(#lu) OR #lu <= :now)");
    }
    built(up.condition_expression(condition).build())
}

/// What each item of a transaction guards, to name the failed condition.
pub(super) fn conflict_of(
    kinds: &[Conflict],
    e: &SdkError<TransactWriteItemsError>,
) -> Option<Conflict> {
    match super::condition_failure(e)? {
        ConditionFailure::Condition(Some(i)) => kinds.get(i).copied().or(Some(Conflict::Key)),
        // Another transaction touched the same items: read again and decide again.
        ConditionFailure::Condition(None) | ConditionFailure::Conflict => Some(Conflict::Key),
    }
}

/// The items of execute's atomic step, and what each one's failed condition means.
fn commit_items(
    n_: &Names,
    c: &ExecuteCommit,
    now: Millis,
) -> StoreResult<(Vec<TransactWriteItem>, Vec<Conflict>)> {
    let mut items: Vec<TransactWriteItem> = Vec::new();
    let mut kinds: Vec<Conflict> = Vec::new();

    // The key.
    let put = Put::builder()
        .table_name(&n_.idempotency)
        .set_item(Some(key_item(&c.key)?));
    let put = match &c.key_condition {
        KeyCondition::Absent => put
            .condition_expression("attribute_not_exists(pk) OR expires_at <= :now")
            .expression_attribute_values(":now", n(now)),
        KeyCondition::ClaimedBy(owner) => put
            .condition_expression("lease_owner = :owner AND expires_at > :now")
            .expression_attribute_values(":owner", s(owner.clone()))
            .expression_attribute_values(":now", n(now)),
    };
    items.push(
        TransactWriteItem::builder()
            .put(built(put.build())?)
            .build(),
    );
    kinds.push(Conflict::Key);

    // The plan: planned -> executed / closed.
    if let Some((plan_id, change)) = &c.plan_change {
        let (status, attr, value) = match change {
            PlanChange::Execute { action_id } => ("executed", "action_id", action_id),
            PlanChange::Close { reason_code } => ("closed", "closed_reason", reason_code),
        };
        let up = Update::builder()
            .table_name(&n_.plans)
            .key("plan_id", s(plan_id.clone()))
            .update_expression(format!(
                "SET #st = :new, {attr} = :v REMOVE {}",
                super::plans::AWAITING_KEYS
            ))
            .condition_expression("#st = :planned")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":new", s(status))
            .expression_attribute_values(":v", s(value.clone()))
            .expression_attribute_values(":planned", s("planned"));
        items.push(
            TransactWriteItem::builder()
                .update(built(up.build())?)
                .build(),
        );
        kinds.push(Conflict::Plan);
    }

    // The control record is still the one decided on (kill switch, rollout, policy),
    // checked on the executing operator's copy. Every write of the record writes every
    // copy, so a copy is the record; a copy missing where the record exists (a table an
    // older version wrote, before `airlock bootstrap` copied it) fails the check:
    // executes are refused until the record is written again, never let through.
    if let Some(version) = c.control_version {
        // Version 0: no control item yet (the defaults), or one from before versions.
        let expr = if version == 0 {
            "attribute_not_exists(id) OR attribute_not_exists(version) OR version = :v"
        } else {
            "version = :v"
        };
        let cc = ConditionCheck::builder()
            .table_name(&n_.control)
            .key("id", s(control_shard(&c.audit.operator_id)))
            .condition_expression(expr)
            .expression_attribute_values(":v", n(version as i64));
        items.push(
            TransactWriteItem::builder()
                .condition_check(built(cc.build())?)
                .build(),
        );
        kinds.push(Conflict::Control);
    }

    // The account is still active.
    if let Some(account_id) = &c.account_active {
        let cc = ConditionCheck::builder()
            .table_name(&n_.accounts)
            .key("account_id", s(account_id.clone()))
            .condition_expression("#st = :active")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":active", s("active"));
        items.push(
            TransactWriteItem::builder()
                .condition_check(built(cc.build())?)
                .build(),
        );
        kinds.push(Conflict::Account);
    }

    // The operator's rate record: an increment below the limit, or a roll-over to
    // the current minute from the bucket read.
    if let Some(u) = &c.rate {
        let e = RateExpr::of(u);
        let up = Update::builder()
            .table_name(&n_.rate_limits)
            .set_key(Some(e.key))
            .update_expression(e.update)
            .condition_expression(e.condition)
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values(Some(e.values));
        items.push(
            TransactWriteItem::builder()
                .update(built(up.build())?)
                .build(),
        );
        kinds.push(Conflict::Rate);
    }

    // The worst case on the order's side leaves room (absent counts as 0), and the
    // order's contracts are reserved in the same write.
    if let Some(r) = &c.reserve {
        let (attr, cmp, zero_fits) = match r.side {
            crate::core::domain::Side::Buy => ("worst_long", "<=", r.bound >= 0),
            crate::core::domain::Side::Sell => ("worst_short", ">=", r.bound <= 0),
        };
        let within = format!("{attr} {cmp} :bound");
        let expr = if zero_fits {
            format!("attribute_not_exists({attr}) OR {within}")
        } else {
            within
        };
        let up = ddb::exposure_update(&n_.exposures, &r.delta)
            .condition_expression(expr)
            .expression_attribute_values(":bound", n(r.bound));
        items.push(
            TransactWriteItem::builder()
                .update(built(up.build())?)
                .build(),
        );
        kinds.push(Conflict::Position);
    }

    // The account's message window: one more message, below the throttle's cap.
    if let Some(u) = &c.messages {
        items.push(
            TransactWriteItem::builder()
                .update(messages_update(&n_.rate_limits, u)?)
                .build(),
        );
        kinds.push(Conflict::Messages);
    }

    if let Some(a) = &c.action {
        items.push(action_put(&n_.actions, a)?);
        kinds.push(Conflict::Key);
    }
    items.push(audit_put(&n_.audit, &c.audit)?);
    kinds.push(Conflict::Key);
    Ok((items, kinds))
}

#[async_trait]
impl ExecuteLedger for Aws {
    async fn get_key(
        &self,
        principal: &str,
        key: &str,
        now: Millis,
    ) -> StoreResult<Option<KeyRecord>> {
        match self
            .get(
                &self.names.idempotency,
                &[("pk", s(idempotency_pk(principal, key)))],
            )
            .await?
        {
            Some(item) => key_from_item(&item, now),
            None => Ok(None),
        }
    }

    async fn snapshot(
        &self,
        principal: &str,
        key: &str,
        plan_id: &str,
        operator_id: &str,
        now: Millis,
    ) -> StoreResult<ExecuteSnapshot> {
        let n_ = &self.names;
        let ask = |k: &str, v: String| {
            built(
                KeysAndAttributes::builder()
                    .keys(HashMap::from([(k.to_string(), s(v))]))
                    .consistent_read(true)
                    .build(),
            )
        };
        let mut pending: HashMap<String, KeysAndAttributes> = HashMap::from([
            (
                n_.idempotency.clone(),
                ask("pk", idempotency_pk(principal, key))?,
            ),
            (n_.plans.clone(), ask("plan_id", plan_id.to_string())?),
            (n_.control.clone(), {
                // The operator's copy of the control record, and the record itself for a
                // table whose copies were never written (a read: it conflicts with nothing).
                built(
                    KeysAndAttributes::builder()
                        .keys(HashMap::from([(
                            "id".to_string(),
                            s(control_shard(operator_id)),
                        )]))
                        .keys(HashMap::from([("id".to_string(), s(CONTROL_ID))]))
                        .consistent_read(true)
                        .build(),
                )?
            }),
            (
                n_.rate_limits.clone(),
                ask("operator_id", operator_id.to_string())?,
            ),
        ]);
        let mut got: HashMap<String, Vec<Item>> = HashMap::new();
        for attempt in 0..ddb::BATCH_TRIES {
            if attempt > 0 {
                ddb::backoff(attempt).await;
            }
            let o = self
                .ddb
                .batch_get_item()
                .set_request_items(Some(pending))
                .send()
                .await
                .map_err(|e| unavailable("BatchGetItem execute snapshot", &e))?;
            for (t, items) in o.responses.unwrap_or_default() {
                got.entry(t).or_default().extend(items);
            }
            pending = o.unprocessed_keys.unwrap_or_default();
            if pending.is_empty() {
                break;
            }
        }
        if !pending.is_empty() {
            return Err(StoreError::Unavailable(
                "BatchGetItem left keys unprocessed".into(),
            ));
        }
        let controls = got.remove(&n_.control).unwrap_or_default();
        let shard = control_shard(operator_id);
        let find = |id: &str| {
            controls
                .iter()
                .find(|i| opt_s(i, "id").as_deref() == Some(id))
                .cloned()
        };
        let control_item = find(&shard).or_else(|| find(CONTROL_ID));
        let mut one = |t: &str| got.remove(t).and_then(|mut v| v.pop());
        let key = match one(&n_.idempotency) {
            Some(i) => key_from_item(&i, now)?,
            None => None,
        };
        let plan = one(&n_.plans).map(|i| plan_from_item(&i)).transpose()?;
        let control = control_from_item(control_item)?;
        let rate = rate_from_item(operator_id, one(&n_.rate_limits).as_ref());
        Ok(ExecuteSnapshot {
            key,
            plan,
            control,
            rate,
        })
    }

    async fn commit(&self, c: &ExecuteCommit, now: Millis) -> StoreResult<CommitOutcome> {
        let (items, kinds) = commit_items(&self.names, c, now)?;

        // The attempt's owner token as the client request token: a retry of this call
        // after a lost reply succeeds as the original did (DynamoDB keeps it 10 minutes)
        // instead of failing on its own writes.
        match self
            .ddb
            .transact_write_items()
            .set_transact_items(Some(items))
            .set_client_request_token(c.key.owner().map(String::from))
            .send()
            .await
        {
            Ok(_) => Ok(CommitOutcome::Committed),
            Err(e) => match conflict_of(&kinds, &e) {
                Some(conflict) => Ok(CommitOutcome::Conflict(conflict)),
                None => Err(unavailable("TransactWriteItems execute", &e)),
            },
        }
    }

    async fn mark_sent(
        &self,
        decided: &KeyRecord,
        lease_owner: &str,
        action_id: &str,
        now: Millis,
    ) -> StoreResult<bool> {
        let n_ = &self.names;
        let put = Put::builder()
            .table_name(&n_.idempotency)
            .set_item(Some(key_item(decided)?))
            // An expired record counts as absent, as in every other read and condition.
            .condition_expression("lease_owner = :owner AND expires_at > :now")
            .expression_attribute_values(":owner", s(lease_owner))
            .expression_attribute_values(":now", n(now));
        let up = Update::builder()
            .table_name(&n_.actions)
            .key("action_id", s(action_id))
            .update_expression(format!(
                "SET enqueued_at = if_not_exists(enqueued_at, :now), updated_at = :now {}",
                super::actions::REMOVE_UNSENT
            ))
            .condition_expression("attribute_exists(action_id)")
            .expression_attribute_values(":now", n(now));
        let items = put_and_update(put, up)?;
        // A conflict retried inside (`transact_if`): a `false` here means the lease is gone.
        self.transact_if(&items, "mark sent").await
    }

    async fn take_over(&self, claim: &KeyRecord, old_owner: &str) -> StoreResult<bool> {
        match self
            .ddb
            .put_item()
            .table_name(&self.names.idempotency)
            .set_item(Some(key_item(claim)?))
            .condition_expression("lease_owner = :old")
            .expression_attribute_values(":old", s(old_owner))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem take over", &e)),
        }
    }
}
