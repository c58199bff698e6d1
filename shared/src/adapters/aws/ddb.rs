//! DynamoDB item helpers: attribute values in and out, JSON bodies, keys.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::core::domain::Millis;
use crate::core::error::{StoreError, StoreResult};

pub type Item = HashMap<String, AttributeValue>;

pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub fn n(v: i64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub fn get_s<'a>(item: &'a Item, name: &str) -> StoreResult<&'a str> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v),
        _ => Err(StoreError::Corrupt(format!(
            "attribute {name} is not a string"
        ))),
    }
}

pub fn opt_s(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub fn opt_n(item: &Item, name: &str) -> Option<i64> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => None,
    }
}

/// Every record keeps its full JSON in `body`, next to the attributes indexes and
/// conditions use.
pub fn body<T: serde::Serialize>(v: &T) -> StoreResult<AttributeValue> {
    serde_json::to_string(v)
        .map(AttributeValue::S)
        .map_err(|e| StoreError::Corrupt(format!("encoding body: {e}")))
}

pub fn from_body<T: serde::de::DeserializeOwned>(item: &Item) -> StoreResult<T> {
    serde_json::from_str(get_s(item, "body")?)
        .map_err(|e| StoreError::Corrupt(format!("stored body: {e}")))
}

/// `created_key`: zero-padded millis, `#`, id. Sorting it sorts by (created_at, id).
pub fn time_key(ms: Millis, id: &str) -> String {
    format!("{:015}#{id}", ms.max(0))
}

/// Epoch seconds for a TTL attribute.
pub fn ttl_seconds(ms: Millis) -> AttributeValue {
    n(ms.div_euclid(1000))
}

/// Key of an idempotency record: principal and key, length-prefixed so no separator
/// inside either can collide.
pub fn idempotency_pk(principal: &str, key: &str) -> String {
    format!("{}:{principal}#{key}", principal.len())
}

/// The increments of an exposure change: `ADD` creates the item (all zero) when absent, and
/// concurrent increments never conflict. `worst_long` / `worst_short` move with the parts
/// they sum, so a condition can compare them (DynamoDB conditions cannot add attributes).
pub fn exposure_update(
    table: &str,
    d: &crate::core::domain::ExposureDelta,
) -> aws_sdk_dynamodb::types::builders::UpdateBuilder {
    aws_sdk_dynamodb::types::Update::builder()
        .table_name(table)
        .key("account_id", s(d.account_id.clone()))
        .key("symbol", s(d.symbol.clone()))
        .update_expression(
            "ADD #p :p, open_buy :ob, open_sell :os, worst_long :wl, worst_short :ws, submitting :sub",
        )
        .expression_attribute_names("#p", "position")
        .expression_attribute_values(":p", n(d.position))
        .expression_attribute_values(":ob", n(d.open_buy))
        .expression_attribute_values(":os", n(d.open_sell))
        .expression_attribute_values(":wl", n(d.worst_long()))
        .expression_attribute_values(":ws", n(d.worst_short()))
        .expression_attribute_values(":sub", n(d.submitting))
}

/// The condition of a sync's exposure update: no order of the contract is between its
/// claim for the broker and its record (see [`crate::core::domain::ExposureDelta::submitting`]).
pub const NONE_SUBMITTING: &str = "attribute_not_exists(submitting) OR submitting <= :zero";

pub fn exposure_from_item(item: Option<&Item>) -> crate::core::domain::Exposure {
    match item {
        Some(i) => crate::core::domain::Exposure {
            position: opt_n(i, "position").unwrap_or(0),
            open_buy: opt_n(i, "open_buy").unwrap_or(0),
            open_sell: opt_n(i, "open_sell").unwrap_or(0),
        },
        None => crate::core::domain::Exposure::default(),
    }
}

/// Tries of a batch call while DynamoDB leaves keys or items unprocessed (it does so when
/// a partition is throttled): the first try and up to five resends of what is left.
pub const BATCH_TRIES: u32 = 6;

/// The longest wait before resend `attempt` (1-based) of what a batch call left
/// unprocessed: exponential from 25 ms, capped at 400 ms (all resends together stay well
/// inside one call's operation timeout).
pub fn backoff_ceiling_ms(attempt: u32) -> u64 {
    (25u64 << attempt.saturating_sub(1).min(8)).min(400)
}

/// Waits before resend `attempt` of unprocessed keys or items: a random time up to the
/// ceiling ("full jitter"), so resends of throttled batches do not arrive back to back.
pub async fn backoff(attempt: u32) {
    use rand::Rng;
    let ms = rand::thread_rng().gen_range(0..=backoff_ceiling_ms(attempt));
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn resends_back_off_exponentially_up_to_a_cap_inside_one_call_budget() {
        let ceilings: Vec<u64> = (1..BATCH_TRIES).map(backoff_ceiling_ms).collect();
        assert_eq!(ceilings, [25, 50, 100, 200, 400]);
        assert_eq!(backoff_ceiling_ms(40), 400, "capped, no overflow");
        assert!(
            ceilings.iter().sum::<u64>() < 1000,
            "below one call's 2 s budget"
        );
    }
}
