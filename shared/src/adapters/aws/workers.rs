//! The workers' writes on DynamoDB; each call is one conditional transaction composed
//! from the entity files' item builders.

use super::ddb::{self, from_body, n, s};
use super::jobs::job_item;
use super::orders::order_item;
use super::positions::position_put;
use super::tables::{built, put_and_update};
use super::{is_condition_failure, unavailable, Aws};
use crate::core::domain::{ActionStatus, ExposureDelta, Job, Millis, Order};
use crate::core::error::{StoreError, StoreResult};
use crate::core::ports::{
    creation_step, open_change_check, replace_check, step_check, ActionMove, PositionChange,
    PositionsReplacement, Stored, WorkerStore,
};
use async_trait::async_trait;
use aws_sdk_dynamodb::types::{Delete, Put, TransactWriteItem, Update};
use std::collections::HashMap;

#[async_trait]
impl WorkerStore for Aws {
    async fn create_order(&self, o: &Order) -> StoreResult<Stored<Order>> {
        let exposure = creation_step(o)?;
        let desk = self
            .desk_of(&o.terms.account_id, &mut HashMap::new())
            .await?;
        let item = order_item(o, &desk)?;
        if exposure.is_zero() {
            return self
                .put_if_absent(&self.names.orders, "order_id", &o.order_id, item, o)
                .await;
        }
        // The order and its step from what execute reserved, in one transaction.
        let put = Put::builder()
            .table_name(&self.names.orders)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(order_id)");
        let up = ddb::exposure_update(&self.names.exposures, &exposure);
        let items = put_and_update(put, up)?;
        if self.transact_if(&items, "create order").await? {
            return Ok(Stored::Created(o.clone()));
        }
        let stored = self
            .get(&self.names.orders, &[("order_id", s(o.order_id.clone()))])
            .await?
            // A condition failed (the exposure's) with no order stored: nothing was written;
            // retryable, as the conflicts `transact_if` gave up on are.
            .ok_or_else(|| {
                StoreError::Unavailable(format!(
                    "order {}: its creation was refused and no order is stored; retry",
                    o.order_id
                ))
            })?;
        Ok(Stored::Found(from_body(&stored)?))
    }

    async fn advance_order(
        &self,
        prev: &Order,
        o: &Order,
        position: Option<&PositionChange>,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool> {
        step_check(prev, o)?;
        let exposure = ExposureDelta::of_order_step(prev, o);
        let items = self.order_write(prev, o, &exposure, position, settles)?;
        self.transact_if(&items, "advance order").await
    }

    async fn replace_order(
        &self,
        prev: &Order,
        next: &Order,
        exposure: &ExposureDelta,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<bool> {
        replace_check(prev, next)?;
        let items = self.order_write(prev, next, exposure, None, settles)?;
        self.transact_if(&items, "replace order").await
    }

    async fn create_job(&self, j: &Job) -> StoreResult<Job> {
        let desk = self.job_desk(j, &mut HashMap::new()).await?;
        let item = job_item(j, &desk)?;
        self.put_if_absent(&self.names.jobs, "job_id", &j.job_id, item, j)
            .await
            .map(Stored::into_inner)
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
        let job_item = TransactWriteItem::builder()
            .update(built(up.build())?)
            .build();
        // One group per position: its write and its exposure move, never split.
        let mut groups: Vec<Vec<TransactWriteItem>> = Vec::new();
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
                groups.push(vec![
                    TransactWriteItem::builder()
                        .delete(built(del.build())?)
                        .build(),
                    self.position_synced(account, &p.symbol, -p.quantity)?,
                ]);
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
                let moved = p.quantity - before.unwrap_or(0);
                groups.push(vec![
                    TransactWriteItem::builder()
                        .put(built(put.build())?)
                        .build(),
                    self.position_synced(account, &p.symbol, moved)?,
                ]);
            }
        }
        // A transaction holds at most 100 items: a large sync is written in chunks, the
        // job's own update in the last. Each position is conditional on the quantity the
        // sync read, so a chunk that fails (a fill recorded in between) leaves the job
        // running and the sync reads again; the chunks already written hold the broker's
        // quantities, which a fill recorded after them adds to correctly (the sync's
        // second reconcile pass has recorded every fill the broker had made by then).
        let chunks = pack(groups, MAX_TRANSACTION_ITEMS - 1);
        let last = chunks.len().saturating_sub(1);
        for (i, mut chunk) in chunks.into_iter().enumerate() {
            if i == last {
                chunk.push(job_item.clone());
            }
            if !self.transact_if(&chunk, "finish job").await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn set_action_status(
        &self,
        action_id: &str,
        from: &[ActionStatus],
        to: ActionStatus,
        error: Option<&str>,
        now: Millis,
    ) -> StoreResult<bool> {
        let m = ActionMove {
            action_id,
            from,
            to,
            error,
            at: now,
        };
        let u = action_move(&self.names.actions, &m)?;
        let up = self
            .ddb
            .update_item()
            .table_name(u.table_name)
            .set_key(Some(u.key))
            .update_expression(u.update_expression)
            .set_condition_expression(u.condition_expression)
            .set_expression_attribute_names(u.expression_attribute_names)
            .set_expression_attribute_values(u.expression_attribute_values);
        match up.send().await {
            Ok(_) => Ok(true),
            Err(e) if is_condition_failure(&e) => Ok(false),
            Err(e) => Err(unavailable("UpdateItem action status", &e)),
        }
    }

    async fn settle_with_exposure(
        &self,
        exposure: &ExposureDelta,
        settles: &ActionMove<'_>,
    ) -> StoreResult<bool> {
        open_change_check(exposure)?;
        if exposure.is_zero() {
            let m = settles;
            return self
                .set_action_status(m.action_id, m.from, m.to, m.error, m.at)
                .await;
        }
        // The exposure's update has no condition: a condition failure is the action's.
        let items = [self.action_item(settles)?, self.exposure_item(exposure)?];
        self.transact_if(&items, "settle with exposure").await
    }
}

impl Aws {
    /// The items of one conditional write of an order (a step or a replace), for one
    /// transaction: the order's update, only if it is still in `prev`'s status, fills and
    /// version; the position at its expected quantity; the exposure's increments; the
    /// action's move.
    fn order_write(
        &self,
        prev: &Order,
        o: &Order,
        exposure: &ExposureDelta,
        position: Option<&PositionChange>,
        settles: Option<&ActionMove<'_>>,
    ) -> StoreResult<Vec<TransactWriteItem>> {
        // The write applies only to the state it was computed from: the status, the fills
        // (two steps from one partially filled state must not both apply) and the version
        // (a step read before a replace must not undo it). An item written before orders
        // had versions has no `version` attribute: it is version 1, as its body reads.
        let mut condition = String::from("#st = :from");
        condition.push_str(if prev.filled_quantity == 0 {
            " AND (attribute_not_exists(filled_quantity) OR filled_quantity = :pf)"
        } else {
            " AND filled_quantity = :pf"
        });
        condition.push_str(if prev.version == 1 {
            " AND (attribute_not_exists(#v) OR #v = :pv)"
        } else {
            " AND #v = :pv"
        });
        let up = Update::builder()
            .table_name(&self.names.orders)
            .key("order_id", s(o.order_id.clone()))
            .update_expression(if o.status.is_at_the_broker() {
                "SET #st = :to, filled_quantity = :nf, #v = :nv, body = :body, open_account = :acc"
            } else {
                "SET #st = :to, filled_quantity = :nf, #v = :nv, body = :body REMOVE open_account"
            })
            .condition_expression(condition)
            .expression_attribute_names("#st", "status")
            .expression_attribute_names("#v", "version")
            .expression_attribute_values(":to", s(o.status.as_str()))
            .expression_attribute_values(":from", s(prev.status.as_str()))
            .expression_attribute_values(":nf", n(o.filled_quantity as i64))
            .expression_attribute_values(":pf", n(prev.filled_quantity as i64))
            .expression_attribute_values(":nv", n(o.version.into()))
            .expression_attribute_values(":pv", n(prev.version.into()))
            .expression_attribute_values(":body", ddb::body(o)?);
        let up = if o.status.is_at_the_broker() {
            up.expression_attribute_values(":acc", s(o.terms.account_id.clone()))
        } else {
            up
        };
        let mut items = vec![TransactWriteItem::builder()
            .update(built(up.build())?)
            .build()];
        if let Some(c) = position {
            items.push(position_put(&self.names.positions, &c.new, c.expected)?);
        }
        if !exposure.is_zero() {
            items.push(self.exposure_item(exposure)?);
        }
        if let Some(m) = settles {
            items.push(self.action_item(m)?);
        }
        Ok(items)
    }

    /// The exposure's increments, as a transaction item.
    fn exposure_item(&self, exposure: &ExposureDelta) -> StoreResult<TransactWriteItem> {
        let up = ddb::exposure_update(&self.names.exposures, exposure);
        Ok(TransactWriteItem::builder()
            .update(built(up.build())?)
            .build())
    }

    /// The action's move under its status condition, as a transaction item.
    fn action_item(&self, m: &ActionMove<'_>) -> StoreResult<TransactWriteItem> {
        Ok(TransactWriteItem::builder()
            .update(action_move(&self.names.actions, m)?)
            .build())
    }
}

/// The update of an action's status [`ActionMove`] makes, alone or in an order's
/// transaction.
fn action_move(table: &str, m: &ActionMove<'_>) -> StoreResult<Update> {
    let mut up = Update::builder()
        .table_name(table)
        .key("action_id", s(m.action_id))
        .expression_attribute_names("#st", "status")
        .expression_attribute_values(":to", s(m.to.as_str()))
        .expression_attribute_values(":now", n(m.at));
    let marks: Vec<String> = (0..m.from.len()).map(|i| format!(":f{i}")).collect();
    for (mark, st) in marks.iter().zip(m.from) {
        up = up.expression_attribute_values(mark.clone(), s(st.as_str()));
    }
    up = up.condition_expression(format!("#st IN ({})", marks.join(", ")));
    // A status a worker moved was delivered: out of the sweeper's unsent indexes.
    const MOVED: &str =
        "SET #st = :to, updated_at = :now, enqueued_at = if_not_exists(enqueued_at, :now)";
    const OUT: &str = super::actions::REMOVE_UNSENT;
    up = match m.error {
        Some(e) => up
            .update_expression(format!("{MOVED}, #err = :e {OUT}"))
            .expression_attribute_names("#err", "error")
            .expression_attribute_values(":e", s(e)),
        None => up.update_expression(format!("{MOVED} {OUT}")),
    };
    built(up.build())
}

/// DynamoDB's limit on the items of one `TransactWriteItems`.
pub(super) const MAX_TRANSACTION_ITEMS: usize = 100;

/// Packs groups of items, in order, into as few chunks of at most `limit` items as the
/// order allows, never splitting a group; always at least one (maybe empty) chunk.
fn pack<T>(groups: Vec<Vec<T>>, limit: usize) -> Vec<Vec<T>> {
    let mut chunks: Vec<Vec<T>> = vec![Vec::new()];
    for g in groups {
        let fits = chunks.last().is_some_and(|c| c.len() + g.len() <= limit);
        if !fits {
            chunks.push(Vec::new());
        }
        if let Some(c) = chunks.last_mut() {
            c.extend(g);
        }
    }
    if chunks.len() > 1 && chunks[0].is_empty() {
        chunks.remove(0);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::pack;

    #[test]
    fn chunks_hold_whole_groups_within_the_limit() {
        // 150 positions, each a write and an exposure move: 300 items in chunks of 99.
        let groups: Vec<Vec<u32>> = (0..150).map(|i| vec![i, i]).collect();
        let chunks = pack(groups, 99);
        assert_eq!(chunks.len(), 4);
        assert!(chunks.iter().all(|c| c.len() <= 99 && c.len() % 2 == 0));
        let flat: Vec<u32> = chunks.concat();
        assert_eq!(flat.len(), 300);
        assert!(flat.windows(2).all(|w| w[0] <= w[1]), "in order");
        // Nothing to write: one empty chunk (for the job's own update).
        assert_eq!(pack::<u32>(vec![], 99), vec![Vec::<u32>::new()]);
        // A first group that fills a chunk exactly.
        assert_eq!(pack(vec![vec![1; 99], vec![2]], 99).len(), 2);
    }
}
