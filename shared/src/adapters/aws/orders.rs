//! Orders on DynamoDB: the orders table and its desk and account indexes.

use super::ddb::{self, from_body, n, s, time_key, Item};
use super::tables::before_key;
use super::Aws;
use crate::auth::DeskScope;
use crate::domain::Order;
use crate::error::StoreResult;
use crate::ports::{OrderFilter, OrderStore, Page, TimeKey};
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
}

/// The one shape of an order's item: keys, the index attributes (desk, account, status,
/// time key) and the order as its JSON body.
pub(super) fn order_item(o: &Order, desk: &str) -> StoreResult<Item> {
    Ok(HashMap::from([
        ("order_id".to_string(), s(o.order_id.clone())),
        ("account_id".to_string(), s(o.terms.account_id.clone())),
        ("desk".to_string(), s(desk)),
        ("status".to_string(), s(o.status.as_str())),
        ("filled_quantity".to_string(), n(o.filled_quantity as i64)),
        (
            "created_key".to_string(),
            s(time_key(o.created_at, &o.order_id)),
        ),
        ("body".to_string(), ddb::body(o)?),
    ]))
}
