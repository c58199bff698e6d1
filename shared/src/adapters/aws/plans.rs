//! Plans on DynamoDB: the plans table; a plan is stored with its audit record in one
//! transaction.

use super::audit::audit_put;
use super::ddb::{self, from_body, get_s, n, opt_s, s, Item};
use super::{unavailable, Aws};
use crate::auth::DeskScope;
use crate::domain::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ports::PlanStore;
use crate::records::{Approval, AuditRecord, PlanRecord, PlanStatus};
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
    Ok(p)
}

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
        approval: &Approval,
        close: Option<&str>,
        audit: &AuditRecord,
        now: Millis,
    ) -> StoreResult<bool> {
        let text = serde_json::to_string(approval)
            .map_err(|e| StoreError::Corrupt(format!("encoding approval: {e}")))?;
        let mut up = Update::builder()
            .table_name(&self.names.plans)
            .key("plan_id", s(plan_id))
            .condition_expression(
                "#st = :planned AND attribute_not_exists(approval) AND expires_at > :now",
            )
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":planned", s("planned"))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":a", s(text));
        up = match close {
            None => up.update_expression("SET approval = :a REMOVE awaiting_desk"),
            Some(reason) => up
                .update_expression(
                    "SET approval = :a, #st = :closed, closed_reason = :r REMOVE awaiting_desk",
                )
                .expression_attribute_values(":closed", s("closed"))
                .expression_attribute_values(":r", s(reason)),
        };
        let up = up.build().map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.transact_if(
            &[
                TransactWriteItem::builder().update(up).build(),
                audit_put(&self.names.audit, audit)?,
            ],
            "TransactWriteItems approval",
        )
        .await
    }

    async fn list_awaiting(
        &self,
        desks: &DeskScope,
        now: Millis,
        limit: u32,
    ) -> StoreResult<Vec<PlanRecord>> {
        let mut out = Vec::new();
        for desk in self.desks(desks).await? {
            let o = self
                .ddb
                .query()
                .table_name(&self.names.plans)
                .index_name("awaiting")
                .key_condition_expression("awaiting_desk = :d AND expires_at > :now")
                .expression_attribute_values(":d", s(desk.clone()))
                .expression_attribute_values(":now", n(now))
                .limit(limit as i32)
                .send()
                .await
                .map_err(|e| unavailable("Query plans awaiting", &e))?;
            for item in o.items.unwrap_or_default() {
                out.push(plan_from_item(&item)?);
            }
        }
        out.sort_by(|a, b| (a.expires_at, &a.plan_id).cmp(&(b.expires_at, &b.plan_id)));
        out.truncate(limit as usize);
        Ok(out)
    }
}
