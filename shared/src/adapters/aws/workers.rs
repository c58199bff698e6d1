//! The workers' writes and the paper broker's book on DynamoDB, each one conditional
//! write or one `TransactWriteItems`.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};

use super::ddb::{self, from_body, n, s, time_key, Item};
use super::{is_condition_failure, unavailable, Aws};
use crate::domain::{Account, ActionStatus, ExposureDelta, Job, Millis, Order, Position};
use crate::error::{StoreError, StoreResult};
use crate::ports::{PaperBookStore, PaperDoc, PositionChange, PositionsReplacement, WorkerStore};

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> StoreResult<T> {
    r.map_err(|e| StoreError::Corrupt(format!("building a request: {e}")))
}

fn position_put(
    table: &str,
    p: &Position,
    expected: Option<i64>,
) -> StoreResult<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("account_id", s(p.account_id.clone()))
        .item("symbol", s(p.symbol.clone()))
        .item("quantity", n(p.quantity))
        .item("body", ddb::body(p)?);
    let put = match expected {
        None => put.condition_expression("attribute_not_exists(account_id)"),
        Some(q) => put
            .condition_expression("quantity = :q")
            .expression_attribute_values(":q", n(q)),
    };
    Ok(TransactWriteItem::builder()
        .put(built(put.build())?)
        .build())
}

impl Aws {
    /// The exposure's copy of a position moved by `by` (a sync replaced it).
    fn position_moved(
        &self,
        account: &str,
        symbol: &str,
        by: i64,
    ) -> StoreResult<TransactWriteItem> {
        let d = ExposureDelta {
            account_id: account.to_string(),
            symbol: symbol.to_string(),
            position: by,
            open_buy: 0,
            open_sell: 0,
        };
        let up = ddb::exposure_update(&self.names.exposures, &d);
        Ok(TransactWriteItem::builder()
            .update(built(up.build())?)
            .build())
    }

    async fn desk_for(&self, account_id: &str) -> StoreResult<String> {
        match self
            .get(&self.names.accounts, &[("account_id", s(account_id))])
            .await?
        {
            Some(item) => Ok(from_body::<Account>(&item)?.desk),
            None => Err(StoreError::Corrupt(format!("no account {account_id}"))),
        }
    }
}

impl Aws {
    /// One `TransactWriteItems`: `true` if written, `false` if a condition failed (or the
    /// transaction conflicted): read again and decide again.
    async fn transact_if(&self, items: &[TransactWriteItem], what: &str) -> StoreResult<bool> {
        match self
            .ddb
            .transact_write_items()
            .set_transact_items(Some(items.to_vec()))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable(&format!("TransactWriteItems {what}"), &e)),
        }
    }

    /// Writes `item` unless an item with this key exists; either way returns the stored
    /// record (the one written, or the one already there: a redelivery creates nothing).
    async fn put_if_absent<T: Clone + serde::de::DeserializeOwned>(
        &self,
        table: &str,
        key_name: &str,
        key: &str,
        item: Item,
        record: &T,
    ) -> StoreResult<T> {
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
            Ok(_) => Ok(record.clone()),
            Err(e) if is_condition_failure(&e) => {
                let item = self
                    .get(table, &[(key_name, s(key))])
                    .await?
                    .ok_or_else(|| StoreError::Corrupt(format!("{key} vanished")))?;
                from_body(&item)
            }
            Err(e) => Err(unavailable("PutItem", &e)),
        }
    }
}

#[async_trait]
impl WorkerStore for Aws {
    async fn create_order(&self, o: &Order) -> StoreResult<Order> {
        let item: Item = HashMap::from([
            ("order_id".to_string(), s(o.order_id.clone())),
            ("account_id".to_string(), s(o.terms.account_id.clone())),
            (
                "desk".to_string(),
                s(self.desk_for(&o.terms.account_id).await?),
            ),
            ("status".to_string(), s(o.status.as_str())),
            ("filled_quantity".to_string(), n(o.filled_quantity as i64)),
            (
                "created_key".to_string(),
                s(time_key(o.created_at, &o.order_id)),
            ),
            ("body".to_string(), ddb::body(o)?),
        ]);
        self.put_if_absent(&self.names.orders, "order_id", &o.order_id, item, o)
            .await
    }

    async fn advance_order(
        &self,
        prev: &Order,
        o: &Order,
        position: Option<&PositionChange>,
    ) -> StoreResult<bool> {
        let from = prev.status;
        let exposure = ExposureDelta::of_order_step(prev, o);
        let up = Update::builder()
            .table_name(&self.names.orders)
            .key("order_id", s(o.order_id.clone()))
            // The step applies only to the state it was computed from: the status and the
            // fills (two steps from one partially filled state must not both apply).
            .update_expression("SET #st = :to, filled_quantity = :nf, body = :body")
            .condition_expression(if prev.filled_quantity == 0 {
                "#st = :from AND (attribute_not_exists(filled_quantity) OR filled_quantity = :pf)"
            } else {
                "#st = :from AND filled_quantity = :pf"
            })
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":to", s(o.status.as_str()))
            .expression_attribute_values(":from", s(from.as_str()))
            .expression_attribute_values(":nf", n(o.filled_quantity as i64))
            .expression_attribute_values(":pf", n(prev.filled_quantity as i64))
            .expression_attribute_values(":body", ddb::body(o)?);
        let mut items = vec![TransactWriteItem::builder()
            .update(built(up.build())?)
            .build()];
        if let Some(c) = position {
            items.push(position_put(&self.names.positions, &c.new, c.expected)?);
        }
        if !exposure.is_zero() {
            let up = ddb::exposure_update(&self.names.exposures, &exposure);
            items.push(
                TransactWriteItem::builder()
                    .update(built(up.build())?)
                    .build(),
            );
        }
        self.transact_if(&items, "advance order").await
    }

    async fn create_job(&self, j: &Job) -> StoreResult<Job> {
        let desk = match &j.account_id {
            Some(a) => self.desk_for(a).await?,
            None => "-".to_string(),
        };
        let item: Item = HashMap::from([
            ("job_id".to_string(), s(j.job_id.clone())),
            ("desk".to_string(), s(desk)),
            ("kind".to_string(), s(j.kind.as_str())),
            ("status".to_string(), s(j.status.as_str())),
            (
                "created_key".to_string(),
                s(time_key(j.created_at, &j.job_id)),
            ),
            ("body".to_string(), ddb::body(j)?),
        ]);
        self.put_if_absent(&self.names.jobs, "job_id", &j.job_id, item, j)
            .await
    }

    async fn finish_job(
        &self,
        j: &Job,
        _result: &serde_json::Value,
        positions: Option<&PositionsReplacement<'_>>,
    ) -> StoreResult<bool> {
        let up = Update::builder()
            .table_name(&self.names.jobs)
            .key("job_id", s(j.job_id.clone()))
            .update_expression("SET #st = :to, body = :body")
            .condition_expression("#st = :running")
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":to", s(j.status.as_str()))
            .expression_attribute_values(":running", s("running"))
            .expression_attribute_values(":body", ddb::body(j)?);
        let mut items = vec![TransactWriteItem::builder()
            .update(built(up.build())?)
            .build()];
        if let Some(r) = positions {
            // Conditional on the positions the sync read (`before`): a fill recorded in
            // between changes a quantity and the whole write fails.
            let (account, existing, rows) = (r.account_id, r.before, r.after);
            // Each position is replaced at the quantity read (a fill in between makes the
            // write fail and the sync read again), and its exposure moves by the difference.
            let held = |symbol: &str| existing.iter().find(|p| p.symbol == symbol);
            for p in existing
                .iter()
                .filter(|p| !rows.iter().any(|r| r.symbol == p.symbol))
            {
                let del = Delete::builder()
                    .table_name(&self.names.positions)
                    .key("account_id", s(p.account_id.clone()))
                    .key("symbol", s(p.symbol.clone()))
                    .condition_expression("quantity = :q")
                    .expression_attribute_values(":q", n(p.quantity));
                items.push(
                    TransactWriteItem::builder()
                        .delete(built(del.build())?)
                        .build(),
                );
                items.push(self.position_moved(account, &p.symbol, -p.quantity)?);
            }
            for p in rows {
                let before = held(&p.symbol).map(|h| h.quantity);
                let put = Put::builder()
                    .table_name(&self.names.positions)
                    .item("account_id", s(p.account_id.clone()))
                    .item("symbol", s(p.symbol.clone()))
                    .item("quantity", n(p.quantity))
                    .item("body", ddb::body(p)?);
                let put = match before {
                    Some(q) => put
                        .condition_expression("quantity = :q")
                        .expression_attribute_values(":q", n(q)),
                    None => put.condition_expression("attribute_not_exists(account_id)"),
                };
                items.push(
                    TransactWriteItem::builder()
                        .put(built(put.build())?)
                        .build(),
                );
                let moved = p.quantity - before.unwrap_or(0);
                if moved != 0 {
                    items.push(self.position_moved(account, &p.symbol, moved)?);
                }
            }
        }
        self.transact_if(&items, "finish job").await
    }

    async fn set_action_status(
        &self,
        action_id: &str,
        from: &[ActionStatus],
        to: ActionStatus,
        error: Option<&str>,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut up = self
            .ddb
            .update_item()
            .table_name(&self.names.actions)
            .key("action_id", s(action_id))
            .expression_attribute_names("#st", "status")
            .expression_attribute_values(":to", s(to.as_str()))
            .expression_attribute_values(":now", n(now));
        let marks: Vec<String> = (0..from.len()).map(|i| format!(":f{i}")).collect();
        for (m, st) in marks.iter().zip(from) {
            up = up.expression_attribute_values(m.clone(), s(st.as_str()));
        }
        up = up.condition_expression(format!("#st IN ({})", marks.join(", ")));
        up = match error {
            Some(e) => up
                .update_expression("SET #st = :to, updated_at = :now, #err = :e")
                .expression_attribute_names("#err", "error")
                .expression_attribute_values(":e", s(e)),
            None => up.update_expression("SET #st = :to, updated_at = :now"),
        };
        match up.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("UpdateItem action status", &e)),
        }
    }
}

#[async_trait]
impl PaperBookStore for Aws {
    async fn load(&self, key: &str) -> StoreResult<(Option<serde_json::Value>, u64)> {
        match self
            .get(&self.names.paper_broker, &[("key", s(key))])
            .await?
        {
            None => Ok((None, 0)),
            Some(item) => {
                let doc = serde_json::from_str(ddb::get_s(&item, "doc")?)
                    .map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))?;
                Ok((Some(doc), ddb::opt_n(&item, "version").unwrap_or(0) as u64))
            }
        }
    }

    async fn save(
        &self,
        key: &str,
        doc: &serde_json::Value,
        expected_version: u64,
    ) -> StoreResult<bool> {
        let put = self
            .ddb
            .put_item()
            .table_name(&self.names.paper_broker)
            .item("key", s(key))
            .item("version", n(expected_version as i64 + 1))
            .item("doc", s(doc.to_string()));
        let put = if expected_version == 0 {
            put.condition_expression("attribute_not_exists(#k)")
                .expression_attribute_names("#k", "key")
        } else {
            put.condition_expression("version = :v")
                .expression_attribute_values(":v", n(expected_version as i64))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("PutItem paper book", &e)),
        }
    }

    async fn save_all(&self, docs: &[PaperDoc]) -> StoreResult<bool> {
        if let [d] = docs {
            return self.save(&d.key, &d.doc, d.expected_version).await;
        }
        let mut items = Vec::with_capacity(docs.len());
        for d in docs {
            let put = Put::builder()
                .table_name(&self.names.paper_broker)
                .item("key", s(d.key.clone()))
                .item("version", n(d.expected_version as i64 + 1))
                .item("doc", s(d.doc.to_string()));
            let put = if d.expected_version == 0 {
                put.condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", "key")
            } else {
                put.condition_expression("version = :v")
                    .expression_attribute_values(":v", n(d.expected_version as i64))
            };
            items.push(
                TransactWriteItem::builder()
                    .put(built(put.build())?)
                    .build(),
            );
        }
        self.transact_if(&items, "paper book").await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<serde_json::Value>> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .ddb
                .scan()
                .table_name(&self.names.paper_broker)
                .consistent_read(true)
                .filter_expression("begins_with(#k, :p)")
                .expression_attribute_names("#k", "key")
                .expression_attribute_values(":p", s(prefix))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| unavailable("Scan paper book", &e))?;
            for item in page.items.unwrap_or_default() {
                out.push(
                    serde_json::from_str(ddb::get_s(&item, "doc")?)
                        .map_err(|e| StoreError::Corrupt(format!("paper book: {e}")))?,
                );
            }
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}
