//! DynamoDB access every entity file uses: single reads, scans, newest-first index
//! queries merged across desks, batched reads and writes with retries of what was left
//! unprocessed, the desk lookup, and conditional transactions.

use super::ddb::{from_body, opt_s, s, time_key, Item};
use super::{condition_failure, is_condition_failure, unavailable, Aws, ConditionFailure};

/// How long [`Aws::transact_if`] keeps sending a transaction that DynamoDB cancels only
/// with `TransactionConflict` (another transaction held one of its items) before it gives
/// up as unavailable (retryable). Far below one call's operation timeout.
pub(super) const CONFLICT_BUDGET_MS: u64 = 400;

/// The longest pause before resend `attempt` (1-based) of a conflicting transaction:
/// exponential from 10 ms, capped at 100 ms; each pause is a random time up to it.
pub(super) fn conflict_backoff_ceiling_ms(attempt: u32) -> u64 {
    (10u64 << attempt.saturating_sub(1).min(8)).min(100)
}
use crate::core::auth::DeskScope;
use crate::core::domain::Account;
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{Stored, TimeKey};
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, TransactWriteItem, WriteRequest};
use std::collections::{BTreeSet, HashMap};

/// Every page of a read: `page(start)` answers one page's items and the key to start the
/// next from (none, or an empty one, after the last page).
async fn every_page<F, Fut>(mut page: F) -> StoreResult<Vec<Item>>
where
    F: FnMut(Option<Item>) -> Fut,
    Fut: std::future::Future<Output = StoreResult<(Vec<Item>, Option<Item>)>>,
{
    let mut out = Vec::new();
    let mut start = None;
    loop {
        let (items, next) = page(start).await?;
        out.extend(items);
        match next {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return Ok(out),
        }
    }
}

/// The `desk` of jobs tied to no account.
pub(super) const NO_DESK: &str = "-";

/// DynamoDB's limit on the keys of one `BatchGetItem`.
pub(super) const MAX_BATCH_GET_KEYS: usize = 100;

impl Aws {
    pub(super) async fn get(
        &self,
        table: &str,
        key: &[(&str, AttributeValue)],
    ) -> StoreResult<Option<Item>> {
        let mut req = self.ddb.get_item().table_name(table).consistent_read(true);
        for (k, v) in key {
            req = req.key(*k, v.clone());
        }
        req.send()
            .await
            .map(|o| o.item)
            .map_err(|e| unavailable(&format!("GetItem {table}"), &e))
    }

    /// Every item of a table, consistently read.
    pub(super) async fn scan_all(&self, table: &str) -> StoreResult<Vec<Item>> {
        self.scan_where(table, None).await
    }

    /// Every item of a table whose `name` begins with `prefix` (all with `None`),
    /// consistently read.
    pub(super) async fn scan_where(
        &self,
        table: &str,
        begins_with: Option<(&str, &str)>,
    ) -> StoreResult<Vec<Item>> {
        every_page(|start| async move {
            let mut q = self
                .ddb
                .scan()
                .table_name(table)
                .consistent_read(true)
                .set_exclusive_start_key(start);
            if let Some((name, prefix)) = begins_with {
                q = q
                    .filter_expression("begins_with(#k, :p)")
                    .expression_attribute_names("#k", name)
                    .expression_attribute_values(":p", s(prefix));
            }
            let o = q
                .send()
                .await
                .map_err(|e| unavailable(&format!("Scan {table}"), &e))?;
            Ok((o.items.unwrap_or_default(), o.last_evaluated_key))
        })
        .await
    }

    /// Every item of the partition `key` = `value`, consistently read.
    pub(super) async fn query_partition(
        &self,
        table: &str,
        key: &str,
        value: &str,
    ) -> StoreResult<Vec<Item>> {
        every_page(|start| async move {
            let o = self
                .ddb
                .query()
                .table_name(table)
                .key_condition_expression("#k = :k")
                .expression_attribute_names("#k", key)
                .expression_attribute_values(":k", s(value))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| unavailable(&format!("Query {table}"), &e))?;
            Ok((o.items.unwrap_or_default(), o.last_evaluated_key))
        })
        .await
    }

    pub(super) async fn all_accounts(&self) -> StoreResult<Vec<Account>> {
        let mut v: Vec<Account> = self
            .scan_all(&self.names.accounts)
            .await?
            .iter()
            .map(from_body)
            .collect::<StoreResult<_>>()?;
        v.sort_by(|a, b| a.account_id.cmp(&b.account_id));
        Ok(v)
    }

    /// The desks a scope covers (all known desks for `All`).
    pub(super) async fn desks(&self, scope: &DeskScope) -> StoreResult<Vec<String>> {
        Ok(match scope {
            DeskScope::All => self
                .all_accounts()
                .await?
                .into_iter()
                .map(|a| a.desk)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            DeskScope::Only(d) => d.iter().cloned().collect(),
        })
    }

    /// Newest-first rows of one index partition, strictly before `before`, at most `want`
    /// after the optional `filter` (attribute name, value).
    pub(super) async fn query_newest(
        &self,
        table: &str,
        index: &str,
        partition: (&str, &str),
        before: Option<&str>,
        filters: &[(&str, String)],
        want: usize,
    ) -> StoreResult<Vec<Item>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut q = self
                .ddb
                .query()
                .table_name(table)
                .index_name(index)
                .scan_index_forward(false)
                .limit(want.max(10) as i32)
                .expression_attribute_names("#p", partition.0)
                .expression_attribute_values(":p", s(partition.1))
                .set_exclusive_start_key(start);
            q = match before {
                Some(b) => q
                    .key_condition_expression("#p = :p AND created_key < :before")
                    .expression_attribute_values(":before", s(b)),
                None => q.key_condition_expression("#p = :p"),
            };
            if !filters.is_empty() {
                let mut expr = Vec::new();
                for (i, (name, value)) in filters.iter().enumerate() {
                    q = q
                        .expression_attribute_names(format!("#f{i}"), *name)
                        .expression_attribute_values(format!(":f{i}"), s(value.clone()));
                    expr.push(format!("#f{i} = :f{i}"));
                }
                q = q.filter_expression(expr.join(" AND "));
            }
            let o = q
                .send()
                .await
                .map_err(|e| unavailable(&format!("Query {table}.{index}"), &e))?;
            out.extend(o.items.unwrap_or_default());
            match o.last_evaluated_key {
                Some(k) if !k.is_empty() && out.len() < want => start = Some(k),
                _ => break,
            }
        }
        out.truncate(want);
        Ok(out)
    }

    /// Merges per-partition newest-first lists into one page.
    /// The newest `want` rows over several desks: one `by_desk` query per desk, merged.
    pub(super) async fn newest_by_desk(
        &self,
        table: &str,
        desk_list: Vec<String>,
        before: Option<&str>,
        filters: &[(&str, String)],
        want: usize,
    ) -> StoreResult<Vec<Item>> {
        let mut all = Vec::new();
        for d in desk_list {
            all.extend(
                self.query_newest(table, "by_desk", ("desk", &d), before, filters, want)
                    .await?,
            );
        }
        Ok(Self::merge_newest(all, want))
    }

    pub(super) fn merge_newest(mut rows: Vec<Item>, limit: usize) -> Vec<Item> {
        rows.sort_by(|a, b| {
            let ka = opt_s(a, "created_key").unwrap_or_default();
            let kb = opt_s(b, "created_key").unwrap_or_default();
            kb.cmp(&ka)
        });
        rows.truncate(limit);
        rows
    }

    /// The items of one table with these values of its (string) partition key, read
    /// consistently with `BatchGetItem`, 100 keys a call; keys left unprocessed are asked
    /// again with backoff. Missing items are absent from the answer, in no order.
    pub(super) async fn batch_get(
        &self,
        table: &str,
        key_name: &str,
        keys: &[String],
    ) -> StoreResult<Vec<Item>> {
        use aws_sdk_dynamodb::types::KeysAndAttributes;
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_BATCH_GET_KEYS) {
            let ask = chunk
                .iter()
                .map(|k| HashMap::from([(key_name.to_string(), s(k.clone()))]))
                .collect::<Vec<_>>();
            let mut pending = Some(built(
                KeysAndAttributes::builder()
                    .set_keys(Some(ask))
                    .consistent_read(true)
                    .build(),
            )?);
            for attempt in 0..super::ddb::BATCH_TRIES {
                let Some(ask) = pending.take() else { break };
                if attempt > 0 {
                    super::ddb::backoff(attempt).await;
                }
                let o = self
                    .ddb
                    .batch_get_item()
                    .request_items(table, ask)
                    .send()
                    .await
                    .map_err(|e| unavailable(&format!("BatchGetItem {table}"), &e))?;
                if let Some(mut got) = o.responses {
                    out.extend(got.remove(table).unwrap_or_default());
                }
                pending = o
                    .unprocessed_keys
                    .and_then(|mut m| m.remove(table))
                    .filter(|k| !k.keys().is_empty());
            }
            if pending.is_some() {
                return Err(StoreError::Unavailable(format!(
                    "BatchGetItem {table}: keys left unprocessed"
                )));
            }
        }
        Ok(out)
    }

    pub(super) async fn batch_put(&self, table: &str, items: Vec<Item>) -> StoreResult<()> {
        for chunk in items.chunks(25) {
            let mut pending: Vec<WriteRequest> = chunk
                .iter()
                .map(|i| {
                    PutRequest::builder()
                        .set_item(Some(i.clone()))
                        .build()
                        .map(|p| WriteRequest::builder().put_request(p).build())
                        .map_err(|e| StoreError::Corrupt(e.to_string()))
                })
                .collect::<StoreResult<_>>()?;
            for attempt in 0..super::ddb::BATCH_TRIES {
                if pending.is_empty() {
                    break;
                }
                if attempt > 0 {
                    super::ddb::backoff(attempt).await;
                }
                let o = self
                    .ddb
                    .batch_write_item()
                    .request_items(table, pending.clone())
                    .send()
                    .await
                    .map_err(|e| unavailable(&format!("BatchWriteItem {table}"), &e))?;
                pending = o
                    .unprocessed_items
                    .and_then(|mut m| m.remove(table))
                    .unwrap_or_default();
            }
            if !pending.is_empty() {
                return Err(StoreError::Unavailable(format!(
                    "BatchWriteItem {table}: items left unprocessed"
                )));
            }
        }
        Ok(())
    }

    pub(super) async fn desk_of(
        &self,
        account_id: &str,
        cache: &mut HashMap<String, String>,
    ) -> StoreResult<String> {
        if let Some(d) = cache.get(account_id) {
            return Ok(d.clone());
        }
        let d = match self
            .get(&self.names.accounts, &[("account_id", s(account_id))])
            .await?
        {
            Some(item) => from_body::<Account>(&item)?.desk,
            None => return Err(StoreError::Corrupt(format!("no account {account_id}"))),
        };
        cache.insert(account_id.to_string(), d.clone());
        Ok(d)
    }
}

pub(super) fn before_key(after: &Option<TimeKey>) -> Option<String> {
    after.as_ref().map(|(ms, id)| time_key(*ms, id))
}

pub(super) fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> StoreResult<T> {
    r.map_err(|e| StoreError::Corrupt(format!("building a request: {e}")))
}

/// A put and an update written together, as a transaction's items.
pub(super) fn put_and_update(
    put: aws_sdk_dynamodb::types::builders::PutBuilder,
    up: aws_sdk_dynamodb::types::builders::UpdateBuilder,
) -> StoreResult<[aws_sdk_dynamodb::types::TransactWriteItem; 2]> {
    use aws_sdk_dynamodb::types::TransactWriteItem;
    Ok([
        TransactWriteItem::builder()
            .put(built(put.build())?)
            .build(),
        TransactWriteItem::builder()
            .update(built(up.build())?)
            .build(),
    ])
}

impl Aws {
    /// One `TransactWriteItems`: `true` if written, `false` if a condition failed (read
    /// again and decide again). A transaction cancelled only by `TransactionConflict` was
    /// not applied and failed no condition: it is sent again after a jittered exponential
    /// pause ([`conflict_backoff_ceiling_ms`]) for up to [`CONFLICT_BUDGET_MS`]; still
    /// conflicting then, it is `Unavailable` (the request answers 503, the message is
    /// retried), never a failed condition.
    pub(super) async fn transact_if(
        &self,
        items: &[TransactWriteItem],
        what: &str,
    ) -> StoreResult<bool> {
        let deadline =
            tokio::time::Instant::now() + std::time::Duration::from_millis(CONFLICT_BUDGET_MS);
        let mut attempt = 0;
        loop {
            match self
                .ddb
                .transact_write_items()
                .set_transact_items(Some(items.to_vec()))
                .send()
                .await
            {
                Ok(_) => return Ok(true),
                Err(e) if matches!(condition_failure(&e), Some(ConditionFailure::Conflict)) => {
                    attempt += 1;
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        tracing::warn!(what, attempts = attempt, "transaction kept conflicting");
                        return Err(StoreError::Unavailable(format!(
                            "TransactWriteItems {what}: cancelled by transaction conflicts \
                             {attempt} times in {CONFLICT_BUDGET_MS} ms (a hot item); retry"
                        )));
                    }
                    let pause = {
                        use rand::Rng;
                        rand::thread_rng().gen_range(0..=conflict_backoff_ceiling_ms(attempt))
                    };
                    tokio::time::sleep(std::time::Duration::from_millis(pause).min(left)).await;
                }
                Err(e) if is_condition_failure(&e) => return Ok(false),
                Err(e) => return Err(unavailable(&format!("TransactWriteItems {what}"), &e)),
            }
        }
    }

    /// Writes `item` unless an item with this key exists; either way returns the stored
    /// record (the one written, or the one already there: a redelivery creates nothing).
    pub(super) async fn put_if_absent<T: Clone + serde::de::DeserializeOwned>(
        &self,
        table: &str,
        key_name: &str,
        key: &str,
        item: Item,
        record: &T,
    ) -> StoreResult<Stored<T>> {
        let r = self
            .ddb
            .put_item()
            .table_name(table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", key_name)
            .send()
            .await;
        match r {
            Ok(_) => Ok(Stored::Created(record.clone())),
            Err(e) if is_condition_failure(&e) => {
                let item = self
                    .get(table, &[(key_name, s(key))])
                    .await?
                    .ok_or_else(|| StoreError::Corrupt(format!("{key} vanished")))?;
                from_body(&item).map(Stored::Found)
            }
            Err(e) => Err(unavailable("PutItem", &e)),
        }
    }
}

#[cfg(test)]
mod conflict_tests {
    use super::*;

    #[test]
    fn conflicting_transactions_back_off_exponentially_within_the_budget() {
        let ceilings: Vec<u64> = (1..=6).map(conflict_backoff_ceiling_ms).collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 100, 100]);
        assert_eq!(conflict_backoff_ceiling_ms(60), 100, "capped, no overflow");
        // At least five resends fit in the budget whatever the jitter draws.
        assert!(ceilings[..5].iter().sum::<u64>() < CONFLICT_BUDGET_MS);
    }
}
