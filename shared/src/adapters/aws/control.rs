//! The control record on DynamoDB (kill switch, rollout modes, policy), written at a version.
//!
//! The record is `id = "global"`, and every write of it also writes the same record to
//! [`CONTROL_SHARDS`] copies (`global#0` ...), in one transaction. Execute's commit checks
//! the version on the copy of its operator's shard ([`control_shard`]), never on `global`:
//! DynamoDB cancels transactions that touch one item at the same time, so one item in
//! every execute would cap the whole firm's execute rate. A change is still seen by every
//! execute decided before it (its shard's version moved in the same write), so the kill
//! switch's guarantee holds. Readers that are not in a transaction read `global`.

use super::ddb::{self, from_body, n, s, Item};
use super::tables::built;
use super::Aws;
use crate::core::error::StoreResult;
use crate::core::ports::ControlStore;
use crate::core::records::Control;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::builders::PutBuilder;
use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use std::collections::HashMap;

pub(super) const CONTROL_ID: &str = "global";
/// How many copies execute's commits are spread over (a write of the record is one
/// transaction of the record and its copies: at most 100 items).
pub(super) const CONTROL_SHARDS: u32 = 16;

/// The copy of the control record an operator's executes check.
pub(super) fn control_shard(operator_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(operator_id.as_bytes());
    let n = u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % CONTROL_SHARDS;
    format!("{CONTROL_ID}#{n}")
}

pub(super) fn control_from_item(item: Option<Item>) -> StoreResult<Control> {
    match item {
        Some(i) => from_body(&i),
        None => Ok(Control::default()),
    }
}

#[async_trait]
impl ControlStore for Aws {
    async fn get_control(&self) -> StoreResult<Control> {
        control_from_item(
            self.get(&self.names.control, &[("id", s(CONTROL_ID))])
                .await?,
        )
    }

    async fn put_control(&self, c: &Control, expected_version: u64) -> StoreResult<bool> {
        // `version` is what execute's commit checks (a ConditionCheck on the version it
        // decided on); `trade_execute_enabled` and `rollout` are attributes too, for a reader
        // of the table.
        let rollout: HashMap<String, AttributeValue> = c
            .rollout
            .iter()
            .map(|(k, v)| {
                let mode = serde_json::to_value(v)
                    .ok()
                    .and_then(|x| x.as_str().map(String::from))
                    .unwrap_or_default();
                (k.clone(), s(mode))
            })
            .collect();
        let item = |id: &str| -> StoreResult<PutBuilder> {
            let put = Put::builder()
                .table_name(&self.names.control)
                .item("id", s(id))
                .item(
                    "trade_execute_enabled",
                    AttributeValue::Bool(c.trade_execute_enabled),
                )
                .item("rollout", AttributeValue::M(rollout.clone()))
                .item("version", n(c.version as i64))
                .item("body", ddb::body(c)?);
            Ok(put)
        };
        // Version 0 is "never written" (or written before versions existed). The copies
        // follow the record: written whatever they held (one written by an older version
        // that wrote `global` alone catches up here).
        let global = if expected_version == 0 {
            item(CONTROL_ID)?.condition_expression(
                "attribute_not_exists(id) OR attribute_not_exists(version) OR version = :v",
            )
        } else {
            item(CONTROL_ID)?.condition_expression("version = :v")
        }
        .expression_attribute_values(":v", n(expected_version as i64));
        let mut items = vec![TransactWriteItem::builder()
            .put(built(global.build())?)
            .build()];
        for k in 0..CONTROL_SHARDS {
            let copy = item(&format!("{CONTROL_ID}#{k}"))?;
            items.push(
                TransactWriteItem::builder()
                    .put(built(copy.build())?)
                    .build(),
            );
        }
        self.transact_if(&items, "control").await
    }
}
