//! Actions on DynamoDB: the actions table, its item shape, and the sparse `unsent` index
//! the sweeper lists.

use super::ddb::{self, from_body, get_s, n, opt_n, opt_s, s, Item};
use super::tables::built;
use super::{unavailable, Aws};
use crate::domain::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ports::ActionStore;
use crate::records::ActionRecord;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Put, TransactWriteItem};
use std::collections::HashMap;

/// An action item's body overlaid with its mutable attributes.
pub(super) fn action_from_item(item: &Item) -> StoreResult<ActionRecord> {
    let mut a: ActionRecord = from_body(item)?;
    a.enqueued_at = opt_n(item, "enqueued_at");
    if let Some(st) = opt_s(item, "status") {
        a.status = st.parse().map_err(StoreError::Corrupt)?;
    }
    if let Some(u) = opt_n(item, "updated_at") {
        a.updated_at = u;
    }
    a.error = opt_s(item, "error").or(a.error);
    Ok(a)
}

#[async_trait]
impl ActionStore for Aws {
    async fn get_action(&self, action_id: &str) -> StoreResult<Option<ActionRecord>> {
        self.get(&self.names.actions, &[("action_id", s(action_id))])
            .await?
            .map(|i| action_from_item(&i))
            .transpose()
    }

    async fn list_unsent(
        &self,
        claimed_before: Millis,
        limit: u32,
    ) -> StoreResult<Vec<ActionRecord>> {
        let o = self
            .ddb
            .query()
            .table_name(&self.names.actions)
            .index_name("unsent")
            .key_condition_expression("unsent = :u AND created_at < :t")
            .expression_attribute_values(":u", s("1"))
            .expression_attribute_values(":t", n(claimed_before))
            .limit(limit as i32)
            .send()
            .await
            .map_err(|e| unavailable("Query actions.unsent", &e))?;
        // The index is eventually consistent: re-read each action before trusting it.
        let mut out = Vec::new();
        for item in o.items.unwrap_or_default() {
            let id = get_s(&item, "action_id")?.to_string();
            if let Some(a) = self.get_action(&id).await? {
                if a.enqueued_at.is_none() {
                    out.push(a);
                }
            }
        }
        Ok(out)
    }

    async fn clear_unsent(&self, action_id: &str, now: Millis) -> StoreResult<bool> {
        let r = self
            .ddb
            .update_item()
            .table_name(&self.names.actions)
            .key("action_id", s(action_id))
            .update_expression("SET enqueued_at = :now, updated_at = :now REMOVE unsent")
            .condition_expression("attribute_exists(unsent)")
            .expression_attribute_values(":now", n(now))
            .send()
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("UpdateItem actions (retire unsent)", &e)),
        }
    }
}

pub(super) fn action_put(table: &str, a: &ActionRecord) -> StoreResult<TransactWriteItem> {
    let mut item: Item = HashMap::from([
        ("action_id".to_string(), s(a.action_id.clone())),
        ("plan_id".to_string(), s(a.plan_id.clone())),
        ("status".to_string(), s(a.status.as_str())),
        ("created_at".to_string(), n(a.created_at)),
        ("updated_at".to_string(), n(a.updated_at)),
        ("body".to_string(), ddb::body(a)?),
    ]);
    if a.enqueued_at.is_none() {
        item.insert("unsent".into(), s("1"));
    }
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(action_id)");
    Ok(TransactWriteItem::builder()
        .put(built(put.build())?)
        .build())
}
