//! Orders on DynamoDB: the orders table, its desk and account indexes, and the sparse index
//! of orders at the broker.

use super::ddb::{self, from_body, n, s, time_key, Item};
use super::tables::before_key;
use super::{unavailable, Aws};
use crate::core::auth::DeskScope;
use crate::core::domain::Order;
use crate::core::error::StoreResult;
use crate::core::ports::{OrderFilter, OrderStore, Page, TimeKey};
use async_trait::async_trait;
use std::collections::HashMap;

#[async_trait]
impl OrderStore for Aws {
    async fn list_orders(
        &self,
        desks: &DeskScope,
        filter: &OrderFilter,
        page: &Page<TimeKey>,
    ) -> StoreResult<Vec<Order>> {
        let before = before_key(&page.after);
        let want = page.limit as usize;
        let mut filters = Vec::new();
        if let Some(st) = filter.status {
            filters.push(("status", st.as_str().to_string()));
        }
        let rows = match &filter.account_id {
            // The caller checked the account is visible.
            Some(acc) => {
                self.query_newest(
                    &self.names.orders,
                    "by_account",
                    ("account_id", acc),
                    before.as_deref(),
                    &filters,
                    want,
                )
                .await?
            }
            None => {
                let desk_list = self.desks(desks).await?;
                self.newest_by_desk(
                    &self.names.orders,
                    desk_list,
                    before.as_deref(),
                    &filters,
                    want,
                )
                .await?
            }
        };
        rows.iter().map(from_body).collect()
    }

    async fn get_order(&self, order_id: &str) -> StoreResult<Option<Order>> {
        self.get(&self.names.orders, &[("order_id", s(order_id))])
            .await?
            .map(|i| from_body(&i))
            .transpose()
    }

    async fn list_at_the_broker(&self, account_id: Option<&str>) -> StoreResult<Vec<Order>> {
        let mut out: Vec<Order> = Vec::new();
        let mut start = None;
        loop {
            let o = match account_id {
                Some(acc) => self
                    .ddb
                    .query()
                    .table_name(&self.names.orders)
                    .index_name("open_by_account")
                    .key_condition_expression("open_account = :a")
                    .expression_attribute_values(":a", s(acc))
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map(|o| (o.items, o.last_evaluated_key))
                    .map_err(|e| unavailable("Query orders.open_by_account", &e))?,
                // Every account: the sparse index holds open orders only.
                None => self
                    .ddb
                    .scan()
                    .table_name(&self.names.orders)
                    .index_name("open_by_account")
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map(|o| (o.items, o.last_evaluated_key))
                    .map_err(|e| unavailable("Scan orders.open_by_account", &e))?,
            };
            for item in o.0.unwrap_or_default() {
                out.push(from_body(&item)?);
            }
            match o.1 {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.order_id).cmp(&(b.created_at, &b.order_id)));
        Ok(out)
    }
}

/// The one shape of an order's item: keys, the index attributes (desk, account, status,
/// time key) and the order as its JSON body.
pub(super) fn order_item(o: &Order, desk: &str) -> StoreResult<Item> {
    let mut item = HashMap::from([
        ("order_id".to_string(), s(o.order_id.clone())),
        ("account_id".to_string(), s(o.terms.account_id.clone())),
        ("desk".to_string(), s(desk)),
        ("status".to_string(), s(o.status.as_str())),
        ("filled_quantity".to_string(), n(o.filled_quantity as i64)),
        ("version".to_string(), n(o.version.into())),
        (
            "created_key".to_string(),
            s(time_key(o.created_at, &o.order_id)),
        ),
        ("body".to_string(), ddb::body(o)?),
    ]);
    if o.status.is_at_the_broker() {
        item.insert(OPEN_ACCOUNT.to_string(), s(o.terms.account_id.clone()));
    }
    Ok(item)
}

/// The attribute of the sparse `open_by_account` index.
pub(super) const OPEN_ACCOUNT: &str = "open_account";
