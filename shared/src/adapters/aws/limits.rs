//! The limits port on DynamoDB: items of the rate-limits table beside the execute rate's,
//! each under its own id (the table's key). A rate window is an item as execute's,
//! counted with the same expressions; held calls are one item per operator (`holds`, JSON
//! text, and a `version` for the conditional write); a refusal's mark is an item whose
//! `expires_at` it lasts until, written in one transaction with its audit record; a pace is
//! an item whose `due` is counted on by single conditional updates, never in a transaction
//! (so it conflicts with nothing); an account's message window is an item as a rate window
//! (counted by execute's transaction) with its `locked_until`. Every item carries `ttl`, so
//! the table forgets them.

use super::audit::audit_put;
use super::ddb::{self, n, s};
use super::ledger::{messages_from_item, rate_from_item, RateExpr};
use super::tables::built;
use super::{condition_failure, unavailable, Aws};
use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::limits::{Holds, LimitStore, PaceStep};
use crate::core::records::{AuditRecord, RateState, RateUpdate};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};

/// A held call's item outlives its last hold by this much, then the table's TTL removes it.
const HOLDS_KEPT_MS: Millis = 3_600_000;

/// Rounds of a pace's read and conditional write. A round is lost only when another call
/// moved `due` between the read and the write (from idle to busy, once per idle spell):
/// concurrent admissions of a busy pace are increments that all apply.
const PACE_ROUNDS: usize = 4;

#[async_trait]
impl LimitStore for Aws {
    async fn rate(&self, id: &str) -> StoreResult<RateState> {
        let item = self
            .get(&self.names.rate_limits, &[("operator_id", s(id))])
            .await?;
        Ok(rate_from_item(id, item.as_ref()))
    }

    async fn count_rate(&self, u: &RateUpdate) -> StoreResult<bool> {
        let e = RateExpr::of(u);
        match self
            .ddb
            .update_item()
            .table_name(&self.names.rate_limits)
            .set_key(Some(e.key))
            .update_expression(e.update)
            .condition_expression(e.condition)
            .set_expression_attribute_names(Some(e.names))
            .set_expression_attribute_values(Some(e.values))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if condition_failure(&e).is_some() => Ok(false),
            Err(e) => Err(unavailable("UpdateItem rate", &e)),
        }
    }

    async fn pace(&self, id: &str, step: &PaceStep) -> StoreResult<Option<Millis>> {
        for _ in 0..PACE_ROUNDS {
            let item = self
                .get(&self.names.rate_limits, &[("operator_id", s(id))])
                .await?;
            let due = item
                .as_ref()
                .and_then(|i| ddb::opt_n(i, "due"))
                .unwrap_or(0);
            // `due` only moves forward, so a read that is behind can only admit too soon,
            // which the write's condition then refuses.
            if !step.admits(due) {
                return Ok(Some(due));
            }
            let up = self
                .ddb
                .update_item()
                .table_name(&self.names.rate_limits)
                .key("operator_id", s(id))
                .expression_attribute_names("#d", "due")
                .expression_attribute_names("#ttl", "ttl")
                .expression_attribute_values(":now", n(step.now))
                .expression_attribute_values(
                    ":ttl",
                    ddb::ttl_seconds(step.now + step.tolerance + step.interval + HOLDS_KEPT_MS),
                );
            let up = if due >= step.now {
                // Busy: one more interval, while `due` is still in the window. Concurrent
                // admissions all apply, each checked against the window.
                up.update_expression("SET #d = #d + :i, #ttl = :ttl")
                    .condition_expression("#d BETWEEN :now AND :lim")
                    .expression_attribute_values(":i", n(step.interval))
                    .expression_attribute_values(":lim", n(step.now + step.tolerance))
            } else {
                // Idle: the burst is whole again; start from now.
                up.update_expression("SET #d = :next, #ttl = :ttl")
                    .condition_expression("attribute_not_exists(operator_id) OR #d < :now")
                    .expression_attribute_values(":next", n(step.next(due)))
            };
            match up.send().await {
                Ok(_) => return Ok(None),
                Err(e) if condition_failure(&e).is_some() => continue,
                Err(e) => return Err(unavailable("UpdateItem pace", &e)),
            }
        }
        Err(StoreError::Unavailable(format!(
            "pace {id}: moved under {PACE_ROUNDS} reads in a row; retry"
        )))
    }

    async fn holds(&self, id: &str) -> StoreResult<Holds> {
        let Some(item) = self
            .get(&self.names.rate_limits, &[("operator_id", s(id))])
            .await?
        else {
            return Ok(Holds::default());
        };
        let held = match ddb::opt_s(&item, "holds") {
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("holds of {id}: {e}")))?,
            None => Vec::new(),
        };
        Ok(Holds {
            version: ddb::opt_n(&item, "version").unwrap_or(0).max(0) as u64,
            held,
        })
    }

    async fn put_holds(&self, id: &str, holds: &Holds, expected: u64) -> StoreResult<bool> {
        let text = serde_json::to_string(&holds.held)
            .map_err(|e| StoreError::Corrupt(format!("encoding holds: {e}")))?;
        let last = holds.held.iter().map(|h| h.until).max().unwrap_or(0);
        let up = self
            .ddb
            .update_item()
            .table_name(&self.names.rate_limits)
            .key("operator_id", s(id))
            .update_expression("SET holds = :h, version = :v, #ttl = :ttl")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":h", s(text))
            .expression_attribute_values(":v", n(holds.version as i64))
            .expression_attribute_values(":ttl", ddb::ttl_seconds(last + HOLDS_KEPT_MS));
        let up = if expected == 0 {
            up.condition_expression("attribute_not_exists(operator_id)")
        } else {
            up.condition_expression("version = :old")
                .expression_attribute_values(":old", n(expected as i64))
        };
        match up.send().await {
            Ok(_) => Ok(true),
            Err(e) if condition_failure(&e).is_some() => Ok(false),
            Err(e) => Err(unavailable("UpdateItem holds", &e)),
        }
    }

    async fn messages(&self, id: &str) -> StoreResult<crate::core::throttle::MessageWindow> {
        let item = self
            .get(&self.names.rate_limits, &[("operator_id", s(id))])
            .await?;
        Ok(messages_from_item(id, item.as_ref()))
    }

    async fn lock_messages(&self, id: &str, until: Millis, keep_until: Millis) -> StoreResult<()> {
        match self
            .ddb
            .update_item()
            .table_name(&self.names.rate_limits)
            .key("operator_id", s(id))
            .update_expression("SET #lu = :until, #ttl = :ttl")
            .condition_expression("attribute_not_exists(#lu) OR #lu < :until")
            .expression_attribute_names("#lu", "locked_until")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":until", n(until))
            .expression_attribute_values(":ttl", ddb::ttl_seconds(keep_until))
            .send()
            .await
        {
            // Locked out longer already: the lockout never moves back.
            Ok(_) => Ok(()),
            Err(e) if condition_failure(&e).is_some() => Ok(()),
            Err(e) => Err(unavailable("UpdateItem message lockout", &e)),
        }
    }

    async fn append_once(
        &self,
        id: &str,
        until: Millis,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool> {
        let mark = Update::builder()
            .table_name(&self.names.rate_limits)
            .key("operator_id", s(id))
            .update_expression("SET expires_at = :until, #ttl = :ttl")
            .condition_expression("attribute_not_exists(operator_id) OR expires_at <= :now")
            .expression_attribute_names("#ttl", "ttl")
            .expression_attribute_values(":until", n(until))
            .expression_attribute_values(":ttl", ddb::ttl_seconds(until))
            .expression_attribute_values(":now", n(now));
        // `false`: the mark is live (the refusal was audited already). A transaction that
        // kept conflicting with another refusal's (which marks the same thing) is retried
        // with backoff, then fails as unavailable.
        self.transact_if(
            &[
                TransactWriteItem::builder()
                    .update(built(mark.build())?)
                    .build(),
                audit_put(&self.names.audit, audit)?,
            ],
            "audit once",
        )
        .await
    }
}
