//! The limits port on DynamoDB: items of the rate-limits table beside the execute rate's,
//! each under its own id (the table's key). A rate window is an item as execute's,
//! counted with the same expressions; held calls are one item per operator (`holds`, JSON
//! text, and a `version` for the conditional write); a refusal's mark is an item whose
//! `expires_at` it lasts until, written in one transaction with its audit record. Every
//! item carries `ttl`, so the table forgets them.

use super::audit::audit_put;
use super::ddb::{self, n, s};
use super::ledger::{rate_from_item, RateExpr};
use super::tables::built;
use super::{condition_failure, unavailable, Aws};
use crate::domain::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ports::limits::{Holds, LimitStore};
use crate::records::{AuditRecord, RateState, RateUpdate};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{TransactWriteItem, Update};

/// A held call's item outlives its last hold by this much, then the table's TTL removes it.
const HOLDS_KEPT_MS: Millis = 3_600_000;

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
