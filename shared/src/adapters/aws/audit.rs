//! The audit log on DynamoDB: append-only records, read back as an id's trail.

use super::ddb::{self, from_body, n, s, time_key, Item};
use super::tables::NO_DESK;
use super::{unavailable, Aws};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{ActionStore, AuditLog};
use crate::core::records::AuditRecord;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use std::collections::HashMap;

fn audit_item(a: &AuditRecord) -> StoreResult<Item> {
    Ok(HashMap::from([
        (
            "plan_id".to_string(),
            s(a.plan_id.clone().unwrap_or_else(|| NO_DESK.into())),
        ),
        ("seq".to_string(), s(time_key(a.at, &a.audit_id))),
        ("at".to_string(), n(a.at)),
        ("body".to_string(), ddb::body(a)?),
    ]))
}

/// Appends never overwrite: a record's sort key is its time and unique id.
const APPEND_ONLY: &str = "attribute_not_exists(seq)";

pub(super) fn audit_put(table: &str, a: &AuditRecord) -> StoreResult<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(audit_item(a)?))
        .condition_expression(APPEND_ONLY)
        .build()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok(TransactWriteItem::builder().put(put).build())
}

#[async_trait]
impl AuditLog for Aws {
    async fn append(&self, rec: &AuditRecord) -> StoreResult<()> {
        self.ddb
            .put_item()
            .table_name(&self.names.audit)
            .set_item(Some(audit_item(rec)?))
            .condition_expression(APPEND_ONLY)
            .send()
            .await
            .map_err(|e| unavailable("PutItem audit", &e))?;
        Ok(())
    }

    async fn trail(&self, id: &str) -> StoreResult<Vec<AuditRecord>> {
        let plan_id = match self.get_action(id).await? {
            Some(a) => a.plan_id,
            None => id.to_string(),
        };
        self.query_partition(&self.names.audit, "plan_id", &plan_id)
            .await?
            .iter()
            .map(from_body::<AuditRecord>)
            .collect()
    }
}
