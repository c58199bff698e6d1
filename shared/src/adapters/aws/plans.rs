//! Plans on DynamoDB: the plans table; a plan is stored with its audit record in one
//! transaction.

use super::audit::audit_put;
use super::ddb::{self, from_body, get_s, n, opt_s, s, Item};
use super::{unavailable, Aws};
use crate::domain::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ports::PlanStore;
use crate::records::{AuditRecord, PlanRecord, PlanStatus};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
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
    Ok(p)
}

/// Plans stay readable for a week after they expire (for `plan_expired` answers and
/// audit), then DynamoDB may delete them.
pub(super) const PLAN_RETENTION_MS: Millis = 7 * 24 * 3600 * 1000;

#[async_trait]
impl PlanStore for Aws {
    async fn put_plan(&self, plan: &PlanRecord, audit: &AuditRecord) -> StoreResult<()> {
        let item: Item = HashMap::from([
            ("plan_id".to_string(), s(plan.plan_id.clone())),
            ("status".to_string(), s("planned")),
            ("expires_at".to_string(), n(plan.expires_at)),
            (
                "ttl".to_string(),
                ddb::ttl_seconds(plan.expires_at + PLAN_RETENTION_MS),
            ),
            ("body".to_string(), ddb::body(plan)?),
        ]);
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
}
