//! Plans on DynamoDB: the plans table; a plan is stored with its audit record in one
//! transaction.

use super::audit::audit_put;
use super::ddb::{self, from_body, get_s, n, opt_s, s, Item};
use super::{unavailable, Aws};
use crate::core::auth::DeskScope;
use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::PlanStore;
use crate::core::records::{ApprovalChange, AuditRecord, PlanPosition, PlanRecord, PlanStatus};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem, Update};
use std::collections::HashMap;

/// A plan item's body overlaid with its mutable attributes.
pub(super) fn plan_from_item(item: &Item) -> StoreResult<PlanRecord> {
    let mut p: PlanRecord = from_body(item)?;
    p.status = match get_s(item, "status")? {
        "planned" => PlanStatus::Planned,
        "executed" => PlanStatus::Executed,
        "closed" => PlanStatus::Closed,
        other => return Err(StoreError::Corrupt(format!("plan status {other}"))),
    };
    p.action_id = opt_s(item, "action_id");
    p.closed_reason = opt_s(item, "closed_reason");
    if let Some(a) = opt_s(item, "approval") {
        p.approval = Some(
            serde_json::from_str(&a)
                .map_err(|e| StoreError::Corrupt(format!("plan approval: {e}")))?,
        );
    }
    if let Some(a) = opt_s(item, "approvals") {
        p.approvals = serde_json::from_str(&a)
            .map_err(|e| StoreError::Corrupt(format!("plan approvals: {e}")))?;
    }
    Ok(p)
}

fn json_text<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Corrupt(format!("encoding approval: {e}")))
}

/// The attributes that key the pending-approvals listings, removed once a plan is decided,
/// executed or closed.
pub(super) const AWAITING_KEYS: &str = "awaiting_desk, awaiting_requester";

/// Plans stay readable for a week after they expire (for `plan_expired` answers and
/// audit), then DynamoDB may delete them.
pub(super) const PLAN_RETENTION_MS: Millis = 7 * 24 * 3600 * 1000;

#[async_trait]
impl PlanStore for Aws {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let mut item: Item = HashMap::from([
            ("plan_id".to_string(), s(plan.plan_id.clone())),
            ("status".to_string(), s("planned")),
            ("expires_at".to_string(), n(plan.expires_at)),
            (
                "ttl".to_string(),
                ddb::ttl_seconds(plan.expires_at + PLAN_RETENTION_MS),
            ),
            ("body".to_string(), ddb::body(plan)?),
        ]);
        if let Some(desk) = plan.awaiting_desk() {
            item.insert("awaiting_desk".to_string(), s(desk));
        }
        if let Some(requester) = plan.awaiting_requester() {
            item.insert("awaiting_requester".to_string(), s(requester));
        }
        let put = Put::builder()
            .table_name(&self.names.plans)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(plan_id)")
            .build()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.ddb
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().put(put).build())
            .transact_items(audit_put(&self.names.audit, audit)?)
            .send()
            .await
            .map_err(|e| unavailable("TransactWriteItems plan", &e))?;
        Ok(())
    }

    async fn get_plan(&self, plan_id: &str) -> StoreResult<Option<PlanRecord>> {
        self.get(&self.names.plans, &[("plan_id", s(plan_id))])
            .await?
            .map(|i| plan_from_item(&i))
            .transpose()
    }

    async fn record_approval(
        &self,
        plan_id: &str,
        change: &ApprovalChange,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut set = vec!["approvals = :list", "approvals_n = :n"];
        let mut up = Update::builder()
            .table_name(&self.names.plans)
            .key("plan_id", s(plan_id))
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":planned", s("planned"))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":list", s(json_text(&change.approvals)?))
            .expression_attribute_values(":n", n(change.approvals.len() as i64));
        // The approvals count read: absent means none.
        let seen = if change.seen == 0 {
            "attribute_not_exists(approvals_n)".to_string()
        } else {
            up = up.expression_attribute_values(":seen", n(change.seen as i64));
            "approvals_n = :seen".to_string()
        };
        up = up.condition_expression(format!(
            "#st = :planned AND attribute_not_exists(approval) AND expires_at > :now AND {seen}"
        ));
        let mut remove = "";
        if let Some(d) = &change.decision {
            set.push("approval = :a");
            up = up.expression_attribute_values(":a", s(json_text(d)?));
            remove = AWAITING_KEYS;
        }
        if let Some(reason) = &change.close {
            set.push("#st = :closed");
            set.push("closed_reason = :r");
            up = up
                .expression_attribute_values(":closed", s("closed"))
                .expression_attribute_values(":r", s(reason.clone()));
        }
        let mut expr = format!("SET {}", set.join(", "));
        if !remove.is_empty() {
            expr.push_str(&format!(" REMOVE {remove}"));
        }
        let up = up
            .update_expression(expr)
            .build()
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.transact_if(
            &[
                TransactWriteItem::builder().update(up).build(),
                audit_put(&self.names.audit, audit)?,
            ],
            "TransactWriteItems approval",
        )
        .await
    }

    async fn list_awaiting_by_requester(
        &self,
        requester: &str,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        self.awaiting(
            ("awaiting_requester", "awaiting_requester", requester),
            now,
            before,
            limit,
        )
        .await
    }

    async fn list_awaiting_four_eyes(
        &self,
        desks: &DeskScope,
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        let mut out = Vec::new();
        for desk in self.desks(desks).await? {
            out.extend(
                self.awaiting(("awaiting", "awaiting_desk", &desk), now, before, limit)
                    .await?,
            );
        }
        out.sort_by(|a, b| (b.expires_at, &b.plan_id).cmp(&(a.expires_at, &a.plan_id)));
        out.truncate(limit as usize);
        Ok(out)
    }
}

impl Aws {
    /// Unexpired plans of one partition of a pending-approvals index, newest (latest
    /// expiry) first, strictly after `before`, at most `limit`, every page read as needed.
    async fn awaiting(
        &self,
        (index, attribute, key): (&str, &str, &str),
        now: Millis,
        before: Option<&PlanPosition>,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut q = self
                .ddb
                .query()
                .table_name(&self.names.plans)
                .index_name(index)
                .scan_index_forward(false)
                .expression_attribute_names("#k", attribute)
                .expression_attribute_values(":k", s(key))
                .expression_attribute_values(":now", n(now))
                .set_exclusive_start_key(start);
            q = match before {
                Some((at, _)) => q
                    .key_condition_expression("#k = :k AND expires_at BETWEEN :now AND :before")
                    .expression_attribute_values(":before", n(*at)),
                None => q.key_condition_expression("#k = :k AND expires_at > :now"),
            };
            let o = q
                .send()
                .await
                .map_err(|e| unavailable("Query plans awaiting", &e))?;
            for item in o.items.unwrap_or_default() {
                let p = plan_from_item(&item)?;
                let after = match before {
                    Some((at, id)) => (p.expires_at, &p.plan_id) < (*at, id),
                    None => true,
                };
                if after && p.expires_at > now {
                    out.push(p);
                }
            }
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() && out.len() < limit as usize => start = Some(k),
                _ => break,
            }
        }
        out.truncate(limit as usize);
        Ok(out)
    }
}
