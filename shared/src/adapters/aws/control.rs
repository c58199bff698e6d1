//! The control record on DynamoDB (kill switch, rollout modes, policy), written at a version.

use super::ddb::{self, from_body, n, s, Item};
use super::{unavailable, Aws};
use crate::error::StoreResult;
use crate::ports::ControlStore;
use crate::records::Control;
use async_trait::async_trait;
use aws_sdk_dynamodb::types::AttributeValue;
use std::collections::HashMap;

pub(super) const CONTROL_ID: &str = "global";

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
        let put = self
            .ddb
            .put_item()
            .table_name(&self.names.control)
            .item("id", s(CONTROL_ID))
            .item(
                "trade_execute_enabled",
                AttributeValue::Bool(c.trade_execute_enabled),
            )
            .item("rollout", AttributeValue::M(rollout))
            .item("version", n(c.version as i64))
            .item("body", ddb::body(c)?);
        // Version 0 is "never written" (or written before versions existed).
        let put = if expected_version == 0 {
            put.condition_expression(
                "attribute_not_exists(id) OR attribute_not_exists(version) OR version = :v",
            )
        } else {
            put.condition_expression("version = :v")
        }
        .expression_attribute_values(":v", n(expected_version as i64));
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if super::is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem control", &e)),
        }
    }
}
